"""Medusa's token tree (engine/spec_decode/medusa_tree.py) through the whole round: the Cartesian paths of the
heads' top-k, pruned to the budget by the product of their probabilities, verified in one target forward.

- the pruned set is a tree of at most the budget and the best by product, against a brute-force enumeration;
- greedy: a tree's output is plain decoding's on the shipped character model with its Medusa heads, each node
  at depth d one of head d's top-k (tests/engine/test_tree_round.py runs Medusa's trees beside EAGLE's on random
  heads, and checks that speculative_eagle_topk 1 is the chain, bit for bit);
- temperature 1: the first token a drafted tree emits has the target's law exactly (enumerated) and by sampling.
"""
import itertools

import numpy as np
import pytest
from test_tree_round import (CODE, drafted_tree, first_token_law, managers_check, no_blocks_used, params_of,
                             rounds, shipped)

from engine.spec_decode.draft import children_of
from engine.spec_decode.medusa_tree import best_paths, medusa_tree
from engine.spec_decode.sampling import probs_from_logits
from engine.spec_decode.tree_verify import verify_tree_draft

TREE = {"method": "medusa", "num_speculative_tokens": 3, "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8}
# the fixture `shipped` (the shipped models) comes from test_tree_round


def brute_force(probs):  # [D, k] -> {rank tuple: its value} over every Cartesian path of depth 1..D
    depth, k = probs.shape
    out = {}
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            value = 1.0
            for level, r in enumerate(ranks):
                value *= float(probs[level, r])
            out[ranks] = value
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_pruned_paths_are_a_tree_of_the_budget_with_the_best_products(seed):
    """Against every path of a small product (3 heads of 3 candidates, 39 paths), at every budget: the kept paths
    are a tree (each path's parent kept) in topological order, as many as the budget allows, and none left out has
    a larger product than one kept. With distinct products the set is exactly the brute force's top `budget`."""
    rng = np.random.default_rng(seed)
    probs = -np.sort(-rng.dirichlet(np.ones(6), size=3)[:, :3], axis=1)      # each head's 3 largest, largest first
    if seed == 0:
        probs = np.full((3, 3), 0.25)                                           # every path of a depth ties
    value = brute_force(probs)
    for budget in range(1, len(value) + 2):
        kept = best_paths(probs, budget)
        assert len(kept) == min(budget, len(value)) and len(set(kept)) == len(kept)
        assert all(len(r) == 1 or r[:-1] in kept[:i] for i, r in enumerate(kept))      # parent first
        left_out = set(value) - set(kept)
        assert not left_out or max(value[r] for r in left_out) <= min(value[r] for r in kept)
        if seed:
            top = sorted(value, key=lambda r: (-value[r], len(r), r))[:budget]
            assert set(kept) == set(top)


@pytest.mark.parametrize("topk,budget", [(2, 4), (3, 8), (4, 16)])
def test_a_greedy_medusa_tree_gives_plain_decodings_output_on_the_shipped_character_model(shipped, topk, budget):
    """Each node at depth d holds one of head d's top-k tokens (siblings in the heads' order), trees of the budget's
    size are verified, and every round keeps the caches whole."""
    head = shipped.registry.heads_for(shipped.registry.get("target-mha"))["medusa"]
    for prompt in CODE:
        _, plain = rounds(shipped, prompt, {"model": "target-mha", "method": "none", "max_tokens": 80})
        settings = {**TREE, "model": "target-mha", "max_tokens": 80, "num_speculative_tokens": 4,
                    "speculative_eagle_topk": topk, "speculative_num_draft_tokens": budget}
        tops = []                                   # per round boundary: head d's top-k for the next round

        def check(s):
            if s.finish_reason:
                return
            managers_check(shipped)
            rows = head.logits(s.features.rows[len(s.tokens) - 2])                  # [K, Vs]
            tops.append([set(head.subset[np.argsort(-row, kind="stable")[:topk]].tolist()) for row in rows])
        events, tree = rounds(shipped, prompt, settings, check)
        assert tree["text"] == plain["text"] and tree["num_drafts"] > 0
        assert tree["draft_tree"] == {"topk": topk, "depth": 4, "num_draft_tokens": budget}
        drafts = [e.tokens for e in events if e.type == "draft"]
        assert max(len(nodes) for nodes in drafts) == budget
        assert no_blocks_used(shipped)
        for top, nodes in zip(tops, drafts[1:]):                                   # the round after each boundary
            depth = {-1: 0}
            for i, t in enumerate(nodes):
                depth[i] = depth[t["parent"]] + 1
                assert t["id"] in top[depth[i] - 1]


def test_a_sampled_medusa_trees_first_token_has_the_targets_law_exactly_and_by_sampling(shipped):
    """Temperature 1 on the shipped model and heads, 4 candidates a head, 8 nodes, depth 3. Head 1's first candidate
    is drawn from its q and verified with it; the root's other children are the head's most likely other tokens,
    each verified as its point mass. Averaged over the draw, the law of the first emitted token (enumerated) is p.
    The heads' whole tree, drawn N = 10,000 times with seed 0 and verified, gives a TVD against p within 4x its
    expected value at the sampling noise, 0.5 sum_x sqrt(2 p(x)(1 - p(x)) / (pi N)). Verifying every child of the
    root with the head's q instead (as if each had been drawn from it) leaves p by more than that tolerance."""
    settings = {**TREE, "model": "target-mha"}
    draft, logits, proposer = drafted_tree(shipped, CODE[0], settings)
    ids = proposer.head.subset
    p = probs_from_logits(logits, 1.0, 1.0)
    q, head_logits = draft.q[0], draft.display_logits[0]                    # head 1's q and logits
    roots = children_of(draft.parents)[-1]
    assert np.allclose(q, probs_from_logits(head_logits, 1.0, 1.0)) and len(roots) >= 2
    assert (draft.q[roots[1:]].max(-1) == 1).all()
    exact, wrong = np.zeros(len(q)), np.zeros(len(q))
    for x in np.flatnonzero(q):                                             # the first child's every draw
        rest = [int(y) for y in np.argsort(-head_logits, kind="stable")[:4] if y != x][:len(roots) - 1]
        exact += q[x] * first_token_law([x] + rest, [q] + [np.eye(len(q))[y] for y in rest], p[0])
        wrong += q[x] * first_token_law([x] + rest, [q] * len(roots), p[0])
    assert np.abs(exact - p[0]).max() <= 1e-12
    depths = draft.depths
    rows = np.stack([draft.display_logits[int(np.flatnonzero(depths == d)[0])][ids]
                     for d in range(1, depths.max() + 1)])                  # the heads' logits [depth, Vs]
    params = params_of(settings, 1.0)
    rng, n, counts = np.random.default_rng(0), 10_000, np.zeros(p.shape[1])
    for _ in range(n):
        tree = medusa_tree(rows, ids, p.shape[1], params, rng)
        assert tree.parents == draft.parents                                # the shape never depends on the draws
        counts[verify_tree_draft(tree, np.repeat(logits[:1], len(tree) + 1, axis=0), 1.0, 1.0, rng).emitted[0]] += 1
    noise = 0.5 * np.sqrt(2 * p[0] * (1 - p[0]) / (np.pi * n)).sum()       # the TVD's expected value at the noise
    tolerance = 4 * noise
    assert 0.5 * np.abs(counts / n - p[0]).sum() <= tolerance
    assert 0.5 * np.abs(wrong - p[0]).sum() > tolerance
