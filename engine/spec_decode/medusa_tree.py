"""Medusa's token tree (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads"), drafted by Medusa heads (engine/spec_decode/heads.py).

Head d reads the feature of the context's last token and guesses the token d places ahead, whatever the tokens
before it are. Each head's k candidates make a Cartesian product of paths: a path is a tuple of ranks
(r_1, ..., r_D), the r_d-th candidate of head d at depth d (the paper's `medusa_choices`). Its value is the
product of the heads' probabilities along it, the paper's estimate of the chance that verification accepts it.
The `num_draft_tokens` paths of highest value are kept (`best_paths`); a path's value is at most its parent's,
so the kept set is a tree, found best-first without enumerating the product.

Greedy (temperature 0): head d's candidates are its top-k tokens, each node's q the point mass on its token;
following the target's argmax down the tree gives plain decoding's output.

Sampling (temperature > 0), made exact by EAGLE-2's sampled-first-child rule (engine/spec_decode/eagle_tree.py)
rather than by point masses alone. Head d's first candidate is drawn from its q (shaped by the temperature and
top-p as the target's p, as a chain's token is) and verified with that q; its others are the head's most likely
tokens other than the drawn one, each verified as the point mass on its token. Why this is exact: verification
(tree_verify.verify_tree) tries a node's children in turn, a Leviathan step from the residual each time, exact
when each child's q is its law given what verification has seen before it. The tree's shape is chosen from
each head's sorted probabilities (the drawn candidate ranks as the head's largest probability, what it would
have at best), never from the tokens drawn, so being in the tree says nothing about the draw; the drawn child
is tried first, and the point-mass siblings after it are fixed by it; the draws of different heads are
independent, and each node's target p depends on the tokens of lower depths only. One draw per head serves every
node of its depth: verification visits one node a depth. Point masses everywhere would be exact too, but accept
p(top-k) at a node where the sampled child accepts sum(min(p, q)), much more when p is flat. With k = 1 the tree
is the sampled chain (MedusaProposer drafts that itself, as before trees).
"""
from __future__ import annotations

import heapq

import numpy as np

from .draft import Draft, DraftParams
from .eagle_tree import log_softmax, top_k
from .proposers import point_masses
from .sampling import full_vocab, probs_from_logits, sample


def best_paths(probs, budget: int) -> list[tuple[int, ...]]:  # [D, k] sorted per head -> at most budget rank tuples
    """The `budget` rank tuples of highest value prod_d probs[d, r_d] among the Cartesian paths of depth 1..D, in
    topological order (by depth, then rank by rank). probs[d] is head d's k largest probabilities, largest first,
    so a child's value is at most its parent's: best-first from the root pops every parent before its children.
    Ties go to the shallower path, then the lower ranks."""
    depth, k = probs.shape
    heap = [(-float(probs[0, r]), 1, (r,)) for r in range(k)]
    heapq.heapify(heap)
    kept = []
    while heap and len(kept) < budget:
        neg_value, d, ranks = heapq.heappop(heap)
        kept.append(ranks)
        if d < depth:
            for r in range(k):
                heapq.heappush(heap, (neg_value * float(probs[d, r]), d + 1, ranks + (r,)))
    return sorted(kept, key=lambda ranks: (len(ranks), ranks))


def medusa_tree(head_logits, ids, vocab_size: int, params: DraftParams, rng) -> Draft:
    """A Medusa tree from the heads' logits over their vocabulary subset, head_logits [D, Vs] (ids [Vs]: its token
    ids; D: the tree's depth at most), of at most params.num_draft_tokens nodes, params.eagle_topk candidates a
    head. Sampling draws one token per head used, in head order, with `rng`."""
    lp = np.stack([log_softmax(row) for row in head_logits])                   # [D, Vs]
    k = min(params.eagle_topk, lp.shape[1])
    top = np.stack([top_k(row, k) for row in lp])                              # [D, k] indices into ids
    paths = best_paths(np.exp(np.take_along_axis(lp, top, axis=1)), params.num_draft_tokens or len(head_logits))
    depth = max(len(ranks) for ranks in paths)
    shown = np.stack([full_vocab(row, ids, vocab_size) for row in head_logits[:depth]])   # [depth, V]
    candidates, q_drawn = [[int(ids[j]) for j in row] for row in top[:depth]], [None] * depth    # [depth][k]
    if params.temperature > 0:
        for d in range(depth):                           # the first candidate drawn, the rest the head's top others
            q_drawn[d] = probs_from_logits(shown[d], params.temperature, params.top_p)
            drawn = sample(q_drawn[d], rng)
            candidates[d] = [drawn] + [x for x in candidates[d] if x != drawn][:k - 1]
    index = {ranks: n for n, ranks in enumerate(paths)}
    tokens = [candidates[len(ranks) - 1][ranks[-1]] for ranks in paths]
    q = point_masses(tokens, vocab_size)                                       # [n, V]
    for n, ranks in enumerate(paths):
        if ranks[-1] == 0 and q_drawn[len(ranks) - 1] is not None:
            q[n] = q_drawn[len(ranks) - 1]
    return Draft(tokens, [index.get(ranks[:-1], -1) for ranks in paths], q,
                 shown[[len(ranks) - 1 for ranks in paths]], forward_calls=depth)
