"""EAGLE-2's dynamic draft trees (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees"), drafted by an EAGLE head (engine/spec_decode/heads.py).

Depth by depth the head expands a frontier: the top-k nodes of the deepest depth by value, a node's value being
the product of the head's probabilities along its path (its cumulative draft probability, EAGLE-2's stand-in
for the chance that verification reaches it). Each frontier node gets k children, and one head forward per
depth scores the whole frontier. A chain of depth γ takes γ head forwards (the catch-up, then one a token); a
tree of depth γ takes as many.

Greedy (temperature 0): a node's children are the head's top-k tokens there, and the `num_draft_tokens` nodes
of highest value over every depth are kept at the end (EAGLE-2's re-ranking; a node's value is at most its
parent's, so they form a tree). Each node's q is the point mass on its token; following the target's argmax
down the tree gives plain decoding's output.

Sampling (temperature > 0), made exact. A node's first child is drawn from the head's q there (shaped by the
temperature and top-p as the target's p), as a chain's token is, and verified with that q; its other children
are the head's most likely tokens other than the first child, fixed by what precedes them, each verified as
the point mass on its token. Verification (tree_verify.verify_tree, each child with its own q row) then tries a
node's children in turn, accept x with min(1, p'(x) / q_i(x)), else p' <- norm(max(0, p' - q_i)): a Leviathan
step from the residual each time, exact when each child's q is its law given what verification has seen before
it (its ancestors and earlier siblings). So whether a drawn child is in the tree must not depend on the token
drawn: nodes are kept depth by depth, each depth's quota of the budget filled before the next depth is drafted,
and a drawn child ranks by its parent's value times the head's largest probability there (what it would have at
best), never by its own token. Siblings after the first are chosen without replacement and deterministically;
with k = 1 the tree is the sampled chain. tests/engine/test_tree_round.py enumerates the first token's law
exactly over the first child's draw, and samples the drafter's expansion of the root.

The head's cache. A node's head entry is (its parent's predicted feature, its token) at position real + depth - 1,
after the `real` entries of the target's own features. Each depth's forward runs the frontier with its
ancestors (at most topk x depth rows; each sees the real entries and its own ancestors, the tree mask) and
then drops them: between rounds the head's cache holds its real entries only, as after a chain.
"""
from __future__ import annotations

from collections.abc import Generator

import numpy as np

from ..kv.runner import ForwardRequest
from .draft import Draft, DraftParams, tree_mask
from .proposers import point_masses
from .sampling import full_vocab, probs_from_logits, sample


def log_softmax(logits):  # [V] -> [V] float64
    z = np.asarray(logits, np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def top_k(values, k: int):  # [V] -> [min(k, V)] indices, the largest value first (ties: the lower index)
    k = min(k, len(values))
    idx = np.argpartition(-values, k - 1)[:k]
    return idx[np.lexsort((idx, -values[idx]))]


def depth_quotas(budget: int, depth: int, topk: int) -> list[int]:  # -> [depth] nodes kept at each depth
    """A sampled tree's budget over its depths, fixed before drafting: k at depth 1, then an even share of the rest
    at each depth (at most k x k: k children of k frontier nodes), so that every depth gets one."""
    quotas, left = [min(topk, budget - depth + 1)], budget - min(topk, budget - depth + 1)
    for d in range(1, depth):
        quotas.append(min(topk * topk, left // (depth - d)))
        left -= quotas[-1]
    return quotas


class DraftTree:
    """The candidate nodes of one round's dynamic tree as they are expanded.

    NOTE: nodes are numbered in the order they are made, depth by depth, which is a topological order; `value`
    is what they are ranked by (module docstring), `q` the distribution each is verified with (None: the point
    mass on its token)."""

    def __init__(self, vocab, vocab_size: int, params: DraftParams, rng):
        self.vocab, self.vocab_size, self.topk, self.params, self.rng = vocab, vocab_size, params.eagle_topk, params, rng
        self.tokens, self.parents, self.depth, self.value, self.q = [], [], [], [], []     # per node
        self.feat_in, self.shown_at = [], []        # per node: its parent's predicted feature [C], its row of shown
        self.shown = []                              # per expanded node: the head's logits there, whole vocabulary [V]

    def __len__(self) -> int:
        return len(self.tokens)

    def expand(self, parent: int, draft_logits, feat) -> list[int]:
        """Give `parent` (-1: the root) k children under the head's logits over the draft vocabulary [Vd]; feat [C]:
        the parent's predicted feature, the children's head entries' input. Returns the new nodes."""
        lp = log_softmax(draft_logits)
        full = full_vocab(draft_logits, self.vocab.ids, self.vocab_size)
        self.shown.append(full)
        base = 0.0 if parent < 0 else self.value[parent]
        top = top_k(lp, self.topk).tolist()
        children = [(j, base + float(lp[j]), None) for j in top]           # greedy: the top-k, point masses
        if self.params.temperature > 0:                                    # the first drawn, ranked as the best
            q = probs_from_logits(full, self.params.temperature, self.params.top_p)
            first = int(np.flatnonzero(self.vocab.ids == sample(q, self.rng))[0])   # q is 0 outside the vocabulary
            rest = [c for c in children if c[0] != first][:self.topk - 1]
            children = [(first, base + float(lp.max()), q)] + rest
        new = []
        for j, value, q in children:
            new.append(len(self.tokens))
            self.tokens.append(int(self.vocab.ids[j]))
            self.parents.append(parent)
            self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
            self.value.append(value)                                        # log of the path's draft probability
            self.q.append(q)
            self.feat_in.append(feat)
            self.shown_at.append(len(self.shown) - 1)
        return new

    def ranked(self, nodes) -> list[int]:
        return sorted(nodes, key=lambda i: (-self.value[i], self.depth[i], i))

    def frontier(self, level: list[int]) -> list[int]:
        """The nodes of one depth to expand: the top-k by value, in node order."""
        return sorted(self.ranked(level)[:self.topk])

    def with_ancestors(self, nodes) -> list[int]:
        out = set()
        for i in nodes:
            while i >= 0 and i not in out:
                out.add(i)
                i = self.parents[i]
        return sorted(out)

    def best(self, budget: int) -> list[int]:
        """The `budget` nodes of highest value (ties: the shallower, then the earlier), in node order."""
        kept = set()
        for i in self.ranked(range(len(self))):
            if len(kept) == budget:
                break
            if self.parents[i] < 0 or self.parents[i] in kept:    # always so: a parent's value is at least its child's
                kept.add(i)
        return sorted(kept)

    def draft(self, nodes) -> Draft:
        index = {node: n for n, node in enumerate(nodes)}
        tokens = [self.tokens[i] for i in nodes]
        q = point_masses(tokens, self.vocab_size)
        for n, i in enumerate(nodes):
            if self.q[i] is not None:
                q[n] = self.q[i]
        return Draft(tokens, [index.get(self.parents[i], -1) for i in nodes], q,
                     np.array([self.shown[self.shown_at[i]] for i in nodes]))


def draft_tree(proposer, root_logits, params: DraftParams, rng) -> Generator[ForwardRequest, np.ndarray, Draft]:
    """An EAGLE head's dynamic tree of depth params.num_speculative_tokens (at most params.num_draft_tokens
    nodes, params.eagle_topk children per expanded node), after its catch-up forward (`proposer`: the session's
    EagleProposer, whose runner holds its real entries; root_logits: the head's logits over its subset there)."""
    head, runner, vocab = proposer.head, proposer.runner, proposer.vocab
    budget = params.num_draft_tokens or params.num_speculative_tokens
    max_depth = min(params.num_speculative_tokens, budget)
    quotas = depth_quotas(budget, max_depth, params.eagle_topk) if params.temperature > 0 else None
    real = runner.num_tokens
    tree = DraftTree(vocab, head.vocab_size, params, rng)
    root_feat = runner.hidden[-1].copy()                                        # the root's predicted feature
    level = tree.expand(-1, vocab.logits(root_logits, root_feat * head.sqrt_c), root_feat)
    kept = level = level if quotas is None else sorted(tree.ranked(level)[:quotas[0]])
    calls = 1
    for d in range(1, max_depth):
        frontier = tree.frontier(level)
        rows = tree.with_ancestors(frontier)
        index = {node: r for r, node in enumerate(rows)}
        sees = tree_mask([index.get(tree.parents[i], -1) for i in rows])        # among the rows: own ancestors
        ids = [tree.tokens[i] for i in rows]
        logits = yield ForwardRequest(runner, ids, mask=np.where(sees, 0.0, -np.inf).astype(np.float32),
                                      inputs_embeds=head.inputs(np.array([tree.feat_in[i] for i in rows]), ids),
                                      positions=np.array([real - 1 + tree.depth[i] for i in rows], np.int64))
        hidden = runner.hidden
        runner.truncate(real)                                                   # the rows were scratch
        calls += 1
        level = []
        for f in frontier:
            r = index[f]
            level += tree.expand(f, vocab.logits(logits[r], hidden[r] * head.sqrt_c), hidden[r])
        if quotas is not None:                    # this depth's quota, chosen before the next depth is drawn
            level = sorted(tree.ranked(level)[:quotas[d]])
            kept = kept + level
    draft = tree.draft(tree.best(budget) if quotas is None else sorted(kept))
    draft.forward_calls = calls
    return draft
