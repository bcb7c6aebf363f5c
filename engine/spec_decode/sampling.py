"""Turning logits into a distribution and a token: temperature, top-p, greedy.

Target p and draft q are shaped by the same temperature and top-p, so that rejection sampling
recovers exactly the distribution plain sampling from the target would give.
"""
from __future__ import annotations

import numpy as np


def softmax(logits, temperature: float = 1.0):  # [..., V] -> [..., V] float64 (probabilities are compared)
    z = np.array(logits, np.float64)                  # a copy, worked on in place: one array, not five
    if temperature != 1.0:
        z /= temperature
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def log_normalisers(logits):  # [n, V] float32 -> [n] float64: log sum_x e^logit(x), so p(x) = e^(logit(x) - it)
    """For figures read off a few entries of softmax(logits) (the inspector's): one float32 exp over the rows
    instead of a float64 softmax of all of them."""
    m = logits.max(axis=-1)
    return m.astype(np.float64) + np.log(np.exp(logits - m[:, None]).sum(axis=-1, dtype=np.float64))


def probs_from_logits(logits, temperature: float, top_p: float = 1.0):  # [..., V] -> [..., V]
    """The sampling distribution. Temperature 0 is greedy: all mass on the argmax (a point mass)."""
    logits = np.asarray(logits)
    if temperature == 0:
        out = np.zeros(logits.shape, np.float64)
        np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    p = softmax(logits, temperature)
    if top_p < 1.0:
        p = top_p_filter(p, top_p)
    return p


def top_p_filter(p, top_p: float):  # [..., V] -> [..., V]
    """Keep the smallest set of most likely tokens whose mass reaches top_p (nucleus sampling)."""
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p       # mass strictly before each token
    keep_sorted = before < top_p                           # the top token is always kept
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    out = np.where(keep, p, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def full_vocab(row, ids, vocab_size):  # [n] logits of tokens `ids` -> [V] with -inf elsewhere
    """A drafter's logits over part of the vocabulary (a head's subset) as a row of the whole vocabulary."""
    out = np.full(vocab_size, -np.inf, np.float32)
    out[ids] = row
    return out


def sample(p, rng: np.random.Generator) -> int:
    """One token from a normalised distribution by inverse CDF (the same draw numpy's choice makes)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))


def draft_confidence(logits, token: int, q) -> float:  # logits [V'] (the drafter's), q [V] or None (greedy)
    """The drafter's probability of its own draft: q(token) when it sampled from q, else (greedy) the largest
    softmax probability of its logits. Drafting stops below a threshold (Hugging Face's
    assistant_confidence_threshold; EAGLE-2 grows its draft tree where this is high): a draft the drafter
    doubts is rarely accepted and costs a drafting step and a verification row."""
    if q is not None:
        return float(q[token])
    z = np.asarray(logits, np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


def top_k_rows(p, k: int = 5):  # [n, V] -> per row [(token, prob)], the k most likely tokens first
    """For the inspector. argpartition over a whole row of a large vocabulary costs milliseconds and would run
    for every verified position, so each row is cut to candidates first: the k-th largest of every 32nd entry
    is at most the row's k-th largest, so the entries >= it hold the top k (exact; usually a few dozen). Rows
    that are mostly 0 (a draft head's q outside its vocabulary subset) keep only their nonzero entries."""
    k = min(k, p.shape[-1])
    idx = np.empty((len(p), k), np.int64)
    for i, row in enumerate(p):
        if (row[::64] == 0).mean() > 0.5:
            cand = np.flatnonzero(row)
            if len(cand) < k:                                  # ties at 0 fill the rest: any zeros will do
                cand = np.union1d(cand, np.flatnonzero(row == 0)[:k])
        elif len(row) >= 32 * k:
            cand = np.flatnonzero(row >= np.partition(row[::32], -k)[-k])
            if len(cand) > len(row) // 8:                      # many ties at the threshold: no cut
                cand = np.arange(len(row))
        else:
            cand = np.arange(len(row))
        idx[i] = cand[np.argpartition(row[cand], -k)[-k:]]
    rows = np.arange(len(p))[:, None]                       # fancy indexing: take_along_axis's checks cost more
    vals = p[rows, idx]
    order = np.argsort(-vals, axis=-1, kind="stable")
    ids, probs = idx[rows, order].tolist(), vals[rows, order].tolist()
    return [list(zip(i, v)) for i, v in zip(ids, probs)]
