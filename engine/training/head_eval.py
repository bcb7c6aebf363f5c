"""Held-out acceptance of draft heads, estimated offline from stored conversations (temperature 0).

The target's greedy answers are the data, so a draft is accepted exactly when it equals the next token of
the answer. For EAGLE the chains are unrolled as drafting runs them (heads.eagle_unroll: step s at
position i is the (s+1)-th draft of the chain started from the real feature at i - s); for Medusa head i
proposes token t+1+i from f_t. A chain started at t accepts its k-th draft when drafts 1..k are all right;
every answer position with γ tokens after it starts one chain. Drafts are the argmax over the draft
vocabulary the engine's proposers use: the subset, and for EAGLE the tokens of the conversation up to the
chain's start (engine.spec_decode.heads.ContextVocabulary); another token is a rejection, as in the engine. `run_acceptance_length` walks each answer as a
run does instead: a chain starts where the last one stopped, so hard spots start more chains than at every
position. This is not `bench heads` (whose figures are timed on a few prompts); it is quick and measures the
heads alone.
"""
from __future__ import annotations

import numpy as np

from . import heads


def _chain_acceptance(correct: np.ndarray, valid: np.ndarray, gamma: int) -> np.ndarray:
    """correct [gamma, T]: draft s+1 of the chain started at t - s is right at t; valid [T] answer positions
    -> [gamma + 1 + 2 gamma]: accepted counts per position and the number of chains (a chain at every
    position), then for each γ = 1..gamma the tokens and rounds of a run (a chain where the last one stopped)."""
    T = correct.shape[1]
    starts = [t for t in range(T - gamma + 1) if valid[t:t + gamma].all()]
    out = np.zeros(3 * gamma + 1)
    for t in starts:
        ok = True
        for s in range(gamma):
            ok = ok and bool(correct[s, t + s])
            out[s] += ok
    out[gamma] = len(starts)
    for g in range(1, gamma + 1):
        t = int(np.argmax(valid)) if valid.any() else T
        while t + g <= T and valid[t:t + g].all():
            accepted = 0
            while accepted < g and correct[accepted, t + accepted]:
                accepted += 1
            out[gamma + g] += accepted + 1                               # the drafts kept and the target's token
            out[2 * gamma + g] += 1
            t += accepted + 1
    return out


def _per_conversation(convs, scale):
    for c in convs:
        f = c.feats.astype(np.float32) * scale                          # [L - 1, C], position t = 0..L-2
        L = len(c.ids)
        t = np.arange(L - 2)                                            # entries whose x_{t+2} exists
        valid = t >= c.first - 1                                        # predicts an answer token
        yield c, f, valid


def _draft_vocabulary(ids, subset, lm_rows):
    """A conversation's draft vocabulary: U = S ∪ its tokens [u], their LM head rows [u, C], and the position
    from which each is in it [u] (-1: S's, always; else its first position in the conversation)."""
    vocab = np.union1d(subset, ids)
    first_at = {}
    for i, x in enumerate(ids.tolist()):
        first_at.setdefault(x, i)
    since = np.array([-1 if s else first_at[u] for u, s in zip(vocab.tolist(), np.isin(vocab, subset))])
    return vocab, lm_rows[vocab], since


def _drafts(logits, vocab, since, start):  # [n, u], chain starts [n] -> the argmax token ids [n]
    """A chain started at t drafts from S and the tokens up to x_{t+1} (the proposer's context then)."""
    return vocab[np.argmax(np.where(since[None, :] <= start[:, None] + 1, logits, -np.inf), -1)]


def eagle_acceptance(params, cfg, convs, subset, lm_rows, embed, gamma: int, scale) -> dict:
    """lm_rows: the target's LM head rows by token id (engine.spec_decode.heads.LMRows) -> {per_position: [gamma],
    mean_acceptance_length: {γ: L for γ = 1..gamma}, chains, run_acceptance_length}."""
    total = np.zeros(3 * gamma + 1)
    for c, f, valid in _per_conversation(convs, scale):
        n = len(valid)
        vocab, rows, since = _draft_vocabulary(c.ids, subset, lm_rows)
        e = embed[c.ids[1:n + 1]][None]                                 # emb(x_{t+1}) [1, n, C]
        correct = np.zeros((gamma, n), bool)
        for s, (fh, _) in enumerate(heads.eagle_unroll(params, cfg, f[None, :n], e, gamma)):
            correct[s] = _drafts(fh[0] @ rows.T, vocab, since, np.arange(n) - s) == c.ids[2:n + 2]
        total += _chain_acceptance(correct, valid, gamma)
    return _summary(total, gamma)


def medusa_acceptance(params, convs, subset, head_w, gamma: int, scale) -> dict:
    """head_w: the LM head's rows of the subset [Vs, C]."""
    total = np.zeros(3 * gamma + 1)
    for c, f, valid in _per_conversation(convs, scale):
        n = len(valid)
        correct = np.zeros((gamma, n), bool)
        for i in range(gamma):                                          # head i + 1 proposes x_{t+2+i}
            w = params[f"medusa.{i}.weight"]
            x = f[:n]
            a = x @ w.T
            r = x + a / (1 + np.exp(-a))
            pred = subset[np.argmax(r @ head_w.T, -1)]                  # at t, for x_{t+2+i}
            ok = np.zeros(n, bool)
            ok[:n - i] = pred[:n - i] == c.ids[2 + i:n + 2]
            correct[i, i:] = ok[:n - i]                                 # indexed like EAGLE: chain start t, row t + i
        total += _chain_acceptance(correct, valid, gamma)
    return _summary(total, gamma)


def _summary(total, gamma) -> dict:
    chains = max(1.0, total[gamma])
    per = total[:gamma] / chains
    tokens, rounds = total[gamma + 1:2 * gamma + 1], np.maximum(1.0, total[2 * gamma + 1:])
    return {"per_position": [round(float(a), 4) for a in per],
            "mean_acceptance_length": {g: round(1 + float(per[:g].sum()), 3) for g in range(1, gamma + 1)},
            "chains": int(total[gamma]),
            "run_acceptance_length": {g: round(float(tokens[g - 1] / rounds[g - 1]), 3) for g in range(1, gamma + 1)}}
