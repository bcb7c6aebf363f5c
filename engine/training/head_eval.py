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

from . import heads, llama, ops


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


# Token trees, estimated offline (temperature 0). A tree verified greedily accepts the nodes of the true path
# that it holds, so per chain start only the true path matters:
# - a static tree (Medusa's) is a set of rank paths, e.g. (0,), (1,), (0, 0): "the head's top token, its
#   second, the top token after the top one". It holds the true path to depth d when the true tokens' ranks
#   r_1..r_d along the true path are a path of the tree, so the ranks give every static tree's acceptance, and
#   the best tree of n nodes is the n rank paths most starts reach (a path is reached no more often than its
#   parent, so they form a tree);
# - EAGLE-2's dynamic tree depends on the head's distributions off the true path too: it is built as drafting
#   builds it, depth by depth: the top-k children of each frontier node, then the k of them with the highest
#   cumulative draft probability become the next frontier; at the end the n nodes of highest cumulative
#   probability are verified.
# A node's entry is EAGLE's (its parent's predicted feature, its token) at the position of its depth; it sees
# the real entries up to the chain's start and its own ancestors' (tree attention).

def _allowed_log_probs(logits, since, start):  # [R, u], [u], [R] -> log softmax over the draft vocabulary [R, u]
    z = np.where(since[None, :] <= start[:, None] + 1, logits, -np.inf)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _top_k(logp, k):  # [R, u] -> column indices, log probs [R, k], best first
    idx = np.argpartition(-logp, k - 1, -1)[:, :k] if k < logp.shape[1] else np.tile(np.arange(logp.shape[1]), (len(logp), 1))
    lp = np.take_along_axis(logp, idx, -1)
    order = np.argsort(-lp, -1, kind="stable")
    return np.take_along_axis(idx, order, -1), np.take_along_axis(lp, order, -1)


def _tree_entries(params, cfg, feats, embeds, pos, start, real_kv, anc_kv, tables):
    """EAGLE's decoder layer on tree nodes: rows [R] with inputs (feats [R, C], embeds [R, C]) at positions pos
    [R]; row r sees the real entries (k, v [K, T, D]) at positions <= start[r], its ancestors' entries
    (k, v [R, a, K, D]) and its own. -> f_hat [R, C], the rows' k, v [R, K, D]."""
    P, H, K, D = heads.LAYER, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    R, G, eps = len(pos), H // K, cfg.rms_norm_eps
    z = np.concatenate([feats, embeds], -1) @ params["fc.weight"].T                          # [R, C]
    h, _ = ops.rmsnorm_forward(z, params[P + "input_layernorm.weight"], eps)
    cos, sin = tables[0][pos][:, None], tables[1][pos][:, None]                              # [R, 1, D]
    q = (h @ params[P + "self_attn.q_proj.weight"].T).reshape(R, H, D)
    k = (h @ params[P + "self_attn.k_proj.weight"].T).reshape(R, K, D)
    v = (h @ params[P + "self_attn.v_proj.weight"].T).reshape(R, K, D)
    q, k = q * cos + ops.rotate_half(q) * sin, k * cos + ops.rotate_half(k) * sin
    ks, vs = np.concatenate([anc_kv[0], k[:, None]], 1), np.concatenate([anc_kv[1], v[:, None]], 1)   # [R, a+1, K, D]
    qg = q.reshape(R, K, G, D).transpose(1, 0, 2, 3) * np.float32(1 / np.sqrt(D))          # [K, R, G, D]
    k_real, v_real = real_kv
    real = (qg.reshape(K, R * G, D) @ k_real.transpose(0, 2, 1)).reshape(K, R, G, -1)      # [K, R, G, T]
    real += np.where(np.arange(k_real.shape[1])[None, :] <= start[:, None], 0, -np.inf)[None, :, None, :]
    own = np.einsum("krgd,rakd->krga", qg, ks)                                               # [K, R, G, a+1]
    p = np.concatenate([real, own], -1)
    p = np.exp(p - p.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    T = real.shape[-1]
    out = (p[..., :T].reshape(K, R * G, T) @ v_real).reshape(K, R, G, D)
    out += np.einsum("krga,rakd->krgd", p[..., T:], vs)
    x = z + out.transpose(1, 0, 2, 3).reshape(R, H * D) @ params[P + "self_attn.o_proj.weight"].T
    h2, _ = ops.rmsnorm_forward(x, params[P + "post_attention_layernorm.weight"], eps)
    m, _ = ops.swiglu_forward(h2 @ params[P + "mlp.gate_proj.weight"].T, h2 @ params[P + "mlp.up_proj.weight"].T)
    x = x + m @ params[P + "mlp.down_proj.weight"].T
    fh, _ = ops.rmsnorm_forward(x, np.ones(x.shape[-1], x.dtype), eps)
    return fh, k, v


def dynamic_tree_nodes(params, cfg, fh0, real_kv, starts, truth, rows, vocab, since, embed, topk, depth):
    """EAGLE-2's tree for every chain start at once (fh0 [T, C]: the head's first step at each position; truth
    [S, depth]: the true drafts) -> the cumulative log probability [S, M], depth [M] and whether the node is on
    the true path [S, M] of every node generated, in the order generated (M = k + (depth - 1) k^2)."""
    S, K, D = len(starts), cfg.num_key_value_heads, cfg.head_dim
    tables = ops.rope_tables(int(starts.max()) + depth + 1, D, cfg.rope_theta, np.float32)
    tok, score = _top_k(_allowed_log_probs(fh0[starts] @ rows.T, since, starts), topk)       # [S, k]
    ids, on = vocab[tok], vocab[tok] == truth[:, :1]
    scores, on_path, depths = [score], [on], [np.ones(topk, np.int64)]
    feat = np.repeat(fh0[starts], topk, 0)                                                    # the parents' f_hat
    anc = (np.zeros((S * topk, 0, K, D), np.float32), np.zeros((S * topk, 0, K, D), np.float32))
    row_start = np.repeat(starts, topk)
    for d in range(1, depth):                        # expand the frontier at depth d (entries at position t + d)
        fh, k, v = _tree_entries(params, cfg, feat, embed[ids.ravel()], row_start + d, row_start, real_kv, anc, tables)
        ctok, clp = _top_k(_allowed_log_probs(fh @ rows.T, since, row_start), topk)          # [S k, k]
        cand = (score.reshape(-1, 1) + clp).reshape(S, topk * topk)
        cids = vocab[ctok].reshape(S, topk * topk)
        con = (on.reshape(-1, 1) & (vocab[ctok] == np.repeat(truth[:, d], topk)[:, None])).reshape(S, -1)
        scores.append(cand), on_path.append(con), depths.append(np.full(topk * topk, d + 1))
        best = np.argsort(-cand, -1, kind="stable")[:, :topk]                                # the next frontier
        parent = (np.arange(S)[:, None] * topk + best // topk).ravel()
        feat = fh[parent]
        anc = (np.concatenate([anc[0][parent], k[parent][:, None]], 1), np.concatenate([anc[1][parent], v[parent][:, None]], 1))
        ids, score, on = [np.take_along_axis(a, best, -1) for a in (cids, cand, con)]
    return np.concatenate(scores, 1), np.concatenate(depths), np.concatenate(on_path, 1)


def accepted_by_budget(scores, depths, on_path, depth, budgets) -> np.ndarray:
    """Draft nodes accepted, summed over the starts, when the n best nodes (by cumulative probability) of the
    tree cut at each depth <= `depth` are verified -> [depth, len(budgets)]. Nodes come in the order generated
    (shallower first), so a stable sort puts a parent before a child of equal score: the n best form a tree."""
    out = np.zeros((depth, len(budgets)))
    for cut in range(1, depth + 1):
        keep = depths <= cut
        order = np.argsort(-np.where(keep, scores, -np.inf), -1, kind="stable")
        hits = np.cumsum(np.take_along_axis(on_path & keep, order, -1), -1)                  # [S, M]
        out[cut - 1] = [hits[:, min(n, hits.shape[1]) - 1].sum() for n in budgets]
    return out


def rank_path_counts(ranks, max_rank: int) -> dict:
    """ranks [S, depth]: the true token's rank at each depth along the true path -> {rank path: starts reaching it}."""
    counts: dict = {}
    for row in ranks.tolist():
        path = ()
        for r in row:
            if r >= max_rank:
                break
            path += (r,)
            counts[path] = counts.get(path, 0) + 1
    return counts


def best_static_tree(counts: dict, n: int) -> list:
    """The n rank paths most starts reach, parents first (Medusa's tree choices, fitted to the data)."""
    return sorted(counts, key=lambda path: (-counts[path], len(path), path))[:n]


def _true_ranks(fh, rows, vocab, since, start, truth):  # [R, C] ... -> rank of the true token [R] (huge: not draftable)
    logits = np.where(since[None, :] <= start[:, None] + 1, fh @ rows.T, -np.inf)
    col = np.clip(np.searchsorted(vocab, truth), 0, len(vocab) - 1)
    mine = logits[np.arange(len(col)), col]
    ok = (vocab[col] == truth) & np.isfinite(mine)
    return np.where(ok, (logits > mine[:, None]).sum(-1), np.iinfo(np.int64).max)


def eagle_tree_acceptance(params, cfg, convs, subset, lm_rows, embed, scale, depth: int = 8,
                          budgets=tuple(range(1, 17)), topks=(1, 2, 4, 8), max_rank: int = 16, log=None) -> dict:
    """Mean acceptance length per budget (draft nodes verified) of the chain, the best static tree (fitted on all
    the starts, and fitted on the other half of the conversations), and EAGLE-2's dynamic tree at its best top-k
    and depth, on the chain starts with `depth` answer tokens after them."""
    dyn = {k: np.zeros((depth, len(budgets))) for k in topks}
    ranks, halves = [], []
    for i, (c, f, valid) in enumerate(_per_conversation(convs, scale)):
        n = len(valid)
        starts = np.array([t for t in range(n - depth + 1) if valid[t:t + depth].all()], np.int64)
        if not len(starts):
            continue
        vocab, rows, since = _draft_vocabulary(c.ids, subset, lm_rows)
        truth = c.ids[starts[:, None] + 2 + np.arange(depth)]                                 # [S, depth]
        r = np.zeros((len(starts), depth), np.int64)
        for s, (fh, cache) in enumerate(heads.eagle_unroll(params, cfg, f[None, :n], embed[c.ids[1:n + 1]][None], depth)):
            r[:, s] = _true_ranks(fh[0, starts + s], rows, vocab, since, starts, truth[:, s])
            if s == 0:
                fh0, real_kv = fh[0], tuple(x[0] for x in llama.layer_kv(cache[1]))
        ranks.append(r)
        halves.append(np.full(len(starts), i % 2))
        for k in topks:
            dyn[k] += accepted_by_budget(*dynamic_tree_nodes(params, cfg, fh0, real_kv, starts, truth, rows, vocab,
                                                             since, embed, k, depth), depth, budgets)
        if log:
            log(f"trees: conversation {i + 1}/{len(convs)}, {len(starts)} starts")
    ranks, halves = np.concatenate(ranks), np.concatenate(halves)
    S = len(ranks)
    counts = rank_path_counts(ranks, max_rank)
    half = [rank_path_counts(ranks[halves == h], max_rank) for h in (0, 1)]
    out = {}
    for j, n in enumerate(budgets):
        tree = best_static_tree(counts, n)
        other = sum(sum(half[1 - h].get(p, 0) for p in best_static_tree(half[h], n)) for h in (0, 1))
        k_best, d_best = max(((k, d) for k in topks for d in range(depth)), key=lambda kd: dyn[kd[0]][kd[1], j])
        chain = 1 + sum(counts.get((0,) * d, 0) for d in range(1, n + 1)) / S if n <= depth else None
        out[n] = {"chain": chain and round(chain, 3),
                  "static": round(1 + sum(counts[p] for p in tree) / S, 3),
                  "static_fitted_on_other_half": round(1 + other / S, 3),
                  "dynamic": round(1 + dyn[k_best][d_best, j] / S, 3),
                  "dynamic_topk": k_best, "dynamic_depth": d_best + 1,
                  "dynamic_by_topk": {k: round(1 + dyn[k][:, j].max() / S, 3) for k in topks},
                  "static_tree": [list(p) for p in tree]}
    return {"starts": S, "max_depth": depth, "max_rank": max_rank, "by_budget": out}


def tree_table(trees: dict) -> str:
    """eagle_tree_acceptance's result as a text table, one budget a line."""
    lines = ["nodes  chain  static  static(other half)  dynamic (top-k, depth)  dynamic by top-k"]
    for n, row in trees["by_budget"].items():
        chain = f"{row['chain']:5.3f}" if row["chain"] is not None else "    -"
        by_k = "  ".join(f"{k}: {v:.3f}" for k, v in row["dynamic_by_topk"].items())
        lines.append(f"{n:5d}  {chain}  {row['static']:6.3f}  {row['static_fitted_on_other_half']:18.3f}  "
                     f"{row['dynamic']:7.3f} ({row['dynamic_topk']}, {row['dynamic_depth']}){'':9s}  {by_k}")
    return "\n".join(lines)
