"""EAGLE-2's dynamic draft trees (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees"), drafted by an EAGLE head (engine/spec_decode/heads.py).

Depth by depth the head expands a frontier: the top-k nodes of the deepest depth by value, a node's value being
the product of the head's probabilities along its path (its cumulative draft probability, EAGLE-2's stand-in
for the chance that verification reaches it). Each frontier node gets its top-k tokens as children, and one head
forward per depth scores the whole frontier. Then the `num_draft_tokens` nodes of highest value over every depth
are kept (EAGLE-2's re-ranking): a node's value is at most its parent's, so the nodes kept form a tree, which
the draft lists in topological order. A chain of depth γ takes γ head forwards (the catch-up, then one a token);
a tree of depth γ takes as many.

Exactness. No random draw chooses a node: the tree is a function of the context. Each node's q is then the point
mass on its token, and verification (tree_verify.verify_tree, children independent) tries a node's children in
turn: accept x with probability p'(x), else p' <- norm(max(0, p' - point mass at x)), p' with x removed. Each
try is a Leviathan step from a point mass, so the token a node emits is distributed as the target's p there
whatever the head proposes (tests/engine/test_tree_round.py enumerates it exactly and samples it). Siblings are
distinct tokens, chosen without replacement but deterministically: the top-k (SGLang verifies its EAGLE trees
from the target's probabilities alone in the same way). The head's own distribution at a node's parent is the
draft's `display_logits`, what the token inspector shows as q when decoding is greedy.

The head's cache. A node's head entry is (its parent's predicted feature, its token) at position real + depth - 1,
after the `real` entries of the target's own features. Each depth's forward runs the frontier with its
ancestors (at most topk x depth rows; each sees the real entries and its own ancestors, the tree mask) and
then drops them: between rounds the head's cache holds its real entries only, as after a chain.
"""
from __future__ import annotations

from collections.abc import Generator

import numpy as np

from ..kv.runner import ForwardRequest
from .draft import Draft, DraftParams
from .proposers import point_masses
from .sampling import full_vocab
from .tree_verify import tree_mask


def log_softmax(logits):  # [V] -> [V] float64
    z = np.asarray(logits, np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def top_k(values, k: int):  # [V] -> [min(k, V)] indices, the largest value first (ties: the lower index)
    k = min(k, len(values))
    idx = np.argpartition(-values, k - 1)[:k]
    return idx[np.lexsort((idx, -values[idx]))]


class DraftTree:
    """The candidate nodes of one round's dynamic tree as they are expanded.

    NOTE: nodes are numbered in the order they are made, depth by depth, which is a topological order."""

    def __init__(self, vocab, vocab_size: int, topk: int):
        self.vocab, self.vocab_size, self.topk = vocab, vocab_size, topk
        self.tokens, self.parents, self.depth, self.value = [], [], [], []   # per node
        self.feat_in, self.shown_at = [], []        # per node: its parent's predicted feature [C], its row of shown
        self.shown = []                              # per expanded node: the head's logits there, whole vocabulary [V]

    def __len__(self) -> int:
        return len(self.tokens)

    def expand(self, parent: int, draft_logits, feat) -> list[int]:
        """Give `parent` (-1: the root) its top-k tokens under the head's logits over the draft vocabulary [Vd];
        feat [C]: the parent's predicted feature, the children's head entries' input. Returns the new nodes."""
        lp = log_softmax(draft_logits)
        self.shown.append(full_vocab(draft_logits, self.vocab.ids, self.vocab_size))
        base = 0.0 if parent < 0 else self.value[parent]
        depth = 1 if parent < 0 else self.depth[parent] + 1
        new = []
        for j in top_k(lp, self.topk).tolist():
            new.append(len(self.tokens))
            self.tokens.append(int(self.vocab.ids[j]))
            self.parents.append(parent)
            self.depth.append(depth)
            self.value.append(base + float(lp[j]))                     # log of the path's draft probability
            self.feat_in.append(feat)
            self.shown_at.append(len(self.shown) - 1)
        return new

    def frontier(self, level: list[int]) -> list[int]:
        """The nodes of one depth to expand: the top-k by value, in node order."""
        return sorted(sorted(level, key=lambda i: (-self.value[i], i))[:self.topk])

    def with_ancestors(self, nodes) -> list[int]:
        out = set()
        for i in nodes:
            while i >= 0 and i not in out:
                out.add(i)
                i = self.parents[i]
        return sorted(out)

    def best(self, budget: int) -> Draft:
        """The `budget` nodes of highest value (ties: the shallower, then the earlier), as a draft in node order."""
        kept = set()
        for i in sorted(range(len(self)), key=lambda i: (-self.value[i], self.depth[i], i)):
            if len(kept) == budget:
                break
            if self.parents[i] < 0 or self.parents[i] in kept:    # always so: a parent's value is at least its child's
                kept.add(i)
        nodes = sorted(kept)
        index = {node: n for n, node in enumerate(nodes)}
        tokens = [self.tokens[i] for i in nodes]
        return Draft(tokens, [index.get(self.parents[i], -1) for i in nodes], point_masses(tokens, self.vocab_size),
                     np.array([self.shown[self.shown_at[i]] for i in nodes]))


def draft_tree(proposer, root_logits, params: DraftParams) -> Generator[ForwardRequest, np.ndarray, Draft]:
    """An EAGLE head's dynamic tree of depth params.num_speculative_tokens (at most params.num_draft_tokens
    nodes, params.eagle_topk children per expanded node), after its catch-up forward (`proposer`: the session's
    EagleProposer, whose runner holds its real entries; root_logits: the head's logits over its subset there)."""
    head, runner, vocab = proposer.head, proposer.runner, proposer.vocab
    budget = params.num_draft_tokens or params.num_speculative_tokens
    max_depth = min(params.num_speculative_tokens, budget)
    real = runner.num_tokens
    tree = DraftTree(vocab, head.vocab_size, params.eagle_topk)
    root_feat = runner.hidden[-1].copy()                                        # the root's predicted feature
    level = tree.expand(-1, vocab.logits(root_logits, root_feat * head.sqrt_c), root_feat)
    calls = 1
    for _ in range(1, max_depth):
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
    draft = tree.best(budget)
    draft.forward_calls = calls
    return draft
