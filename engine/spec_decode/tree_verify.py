"""Verifying a token tree exactly.

A round's draft is a tree (engine/spec_decode/draft.py): node i holds a token, its parent (-1: the root, the
context's last token) and q[i], the draft distribution its token was drawn from. The target scores the root
and every node in one forward, each node seeing the committed context and its own ancestors only
(engine/spec_decode/draft.py: `tree_mask`, `tree_positions`). p is then [n + 1, V]: row 0 the target's distribution after the root, row
i + 1 after node i.

Verification walks down from the root (SpecInfer, Miao et al. 2023, "multi-step speculative sampling"; EAGLE-2
verifies its trees the same way). At a node, with p' = p at that node, try its children x_1, x_2, ... in turn:
- accept x_i with probability min(1, p'(x_i) / q_i(x_i)), and go on at x_i;
- after a rejection, p' <- norm(max(0, p' - q_i)) for the next sibling;
- when every child is rejected, sample the round's last token from p' (resampled);
- at a node without children, sample it from p there (bonus).
This keeps the target's distribution exactly when q_i is the distribution x_i was drawn from given the siblings
tried before it: each try is then a Leviathan step from p' (a proof per step, tests/engine/test_tree_verify.py
checks it exactly and by sampling). Two ways of drawing siblings are covered:
- independently (`without_replacement=False`): each node's own row q[i] is used. This is SpecInfer's children
  drawn with replacement from the parent's q, and also the point masses of a deterministic top-k (EAGLE-2,
  whose verifier zeroes a rejected token in p and renormalises: max(0, p' - point mass) is exactly that);
- without replacement (`without_replacement=True`): siblings share their parent's row q and were drawn one
  after another among the tokens not drawn yet (Gumbel top-k sampling). The i-th then came from
  q_i = norm(q with x_1..x_{i-1} zeroed), which the verifier uses. Using q itself there would be biased.

At temperature 0 p and q are point masses: follow the target's argmax down the tree (`verify_tree_greedy`),
which reproduces plain greedy decoding.

Block verification, the other rule for a chain, is in engine/spec_decode/verify.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .draft import children_of
from .sampling import probs_from_logits, sample
from .verify import TokenVerdict, Verification, acceptance_probability, residual_distribution


def without_drawn(q, drawn):  # [V], earlier siblings' tokens -> [V]
    """q_i for the i-th sibling drawn without replacement: q with the tokens drawn before it removed."""
    if not drawn:
        return q
    q = q.copy()
    q[list(drawn)] = 0.0
    return q / q.sum()


@dataclass
class SiblingTry:
    """One child tried at a node: what the inspector shows beside its siblings."""
    node: int                    # the child's node index
    token: int
    p: float                     # p'(x): the target's (residual) probability of x at this try
    q: float                     # q_i(x)
    accept_prob: float           # min(1, p'(x) / q_i(x))
    r: float | None              # the uniform draw compared with accept_prob (None when greedy)
    accepted: bool
    residual: np.ndarray | None  # [V] after a rejection: norm(max(0, p' - q_i)), the next sibling's p'


@dataclass
class TreeVerification:
    """A round's tree verification, in the terms a drawing of the tree needs."""
    status: list[str]                        # [n] per node: accepted | rejected | unreached
    tries: dict[int, list[SiblingTry]]       # node (-1: root) -> its children tried there, in order
    path: list[int]                          # the accepted nodes, root to leaf
    emitted: list[int]                       # the round's tokens: the path's, then the resampled or bonus token
    last_status: str                         # resampled (every child of the path's end rejected) | bonus
    last_distribution: np.ndarray | None     # [V] what the last token was drawn from (None when greedy)
    verdicts: list[TokenVerdict] = field(default_factory=list)   # as verify.verify's: the path accepted, the
    #                                          last node's rejected children, then the resampled or bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    @property
    def kept_rows(self) -> list[int]:
        """The verification forward's rows whose K/V stay (the runners' `keep_tree_path`): the root's, row 0,
        then the accepted path's, node i being row i + 1."""
        return [0] + [i + 1 for i in self.path]

    @property
    def shown_nodes(self) -> list[int]:
        """The nodes whose q the verdicts' positions show (a position's verdicts come from one row of p and of q):
        the accepted path, then below it the first child tried, where every child was rejected."""
        tried = self.tries.get(self.path[-1] if self.path else -1, [])
        return self.path + ([tried[0].node] if self.last_status == "resampled" and tried else [])


def verify_tree(tokens, parents, q, p, rng: np.random.Generator,
                without_replacement: bool = False) -> TreeVerification:
    """Multi-draft speculative sampling over a tree (temperature > 0).
    tokens [n], parents [n], q [n, V] each node's draft distribution at its parent, p [n + 1, V] (row 0: the
    root's). On a chain it draws the same numbers in the same order as verify.verify, so a seed gives the
    same tokens."""
    tokens, n = [int(x) for x in tokens], len(tokens)
    children = children_of(parents)
    status, tries, path, verdicts = ["unreached"] * n, {}, [], []
    node = -1
    while True:
        kids, p_here = children[node], p[node + 1]
        if not kids:                                            # a leaf (or nothing drafted): the bonus token
            t = sample(p_here, rng)
            verdicts.append(TokenVerdict(t, "bonus", float(p_here[t]), None, None, None, len(path) + 1))
            return TreeVerification(status, tries, path, [tokens[i] for i in path] + [t], "bonus", p_here, verdicts)
        residual, drawn, tried = p_here, [], tries.setdefault(node, [])
        for c in kids:
            q_c = without_drawn(q[c], drawn) if without_replacement else q[c]
            x = tokens[c]
            a = acceptance_probability(residual[x], q_c[x])
            r = float(rng.random())
            verdict = TokenVerdict(x, "accepted" if r < a else "rejected", float(residual[x]), float(q_c[x]), a, r,
                                   len(path) + 1)
            if r < a:
                tried.append(SiblingTry(c, x, verdict.p, verdict.q, a, r, True, None))
                status[c] = "accepted"
                path.append(c)
                verdicts = [v for v in verdicts if v.status == "accepted"] + [verdict]
                node = c
                break
            residual = residual_distribution(residual, q_c)     # p' <- norm(max(0, p' - q_i))
            tried.append(SiblingTry(c, x, verdict.p, verdict.q, a, r, False, residual))
            status[c] = "rejected"
            verdicts.append(verdict)
            drawn.append(x)
        else:                                                   # every child rejected: sample the residual
            t = sample(residual, rng)
            verdicts.append(TokenVerdict(t, "resampled", float(p_here[t]), float(q_c[t]), None, None, len(path) + 1))
            return TreeVerification(status, tries, path, [tokens[i] for i in path] + [t], "resampled", residual,
                                    verdicts)


def verify_tree_greedy(tokens, parents, target_ids) -> TreeVerification:
    """Temperature 0: target_ids [n + 1] is the target's argmax at the root (row 0) and after each node. At each
    node the child holding the target's token is accepted (its earlier siblings rejected, later ones never
    tried); without one the target's token ends the round. The output is plain greedy decoding's."""
    tokens, n = [int(x) for x in tokens], len(tokens)
    children = children_of(parents)
    status, tries, path, verdicts = ["unreached"] * n, {}, [], []
    node = -1
    while True:
        t, tried = int(target_ids[node + 1]), tries.setdefault(node, [])
        for c in children[node]:
            hit = tokens[c] == t
            tried.append(SiblingTry(c, tokens[c], float(hit), 1.0, float(hit), None, hit, None))
            status[c] = "accepted" if hit else "rejected"
            if hit:
                verdicts = [v for v in verdicts if v.status == "accepted"]
            verdicts.append(TokenVerdict(tokens[c], status[c], float(hit), 1.0, float(hit), None, len(path) + 1))
            if hit:
                path.append(c)
                node = c
                break
        else:
            last = "resampled" if children[node] else "bonus"
            verdicts.append(TokenVerdict(t, last, 1.0, 0.0 if last == "resampled" else None, None, None,
                                         len(path) + 1))
            return TreeVerification(status, tries, path, [tokens[i] for i in path] + [t], last, None, verdicts)



def verify_tree_draft(draft, logits, temperature: float, top_p: float, rng: np.random.Generator) -> Verification:
    """A round's token tree (engine/spec_decode/draft.py) verified from the target's logits [n + 1, V] over the
    root and the nodes: greedy at temperature 0, else multi-draft speculative sampling with each node's own q row
    (`without_replacement=False`: a sampled EAGLE-2 tree's first child is drawn from q, its siblings are point
    masses fixed by what precedes them, engine/spec_decode/eagle_tree.py; an n-gram tree's nodes are all point
    masses). Its `p`: the target's rows along the path."""
    if temperature == 0:
        tree = verify_tree_greedy(draft.tokens, draft.parents, logits.argmax(axis=-1).tolist())
        return Verification(tree.verdicts, None, None, tree=tree)
    p = probs_from_logits(logits, temperature, top_p)
    tree = verify_tree(draft.tokens, draft.parents, draft.q, p, rng)
    residual = tree.last_distribution if tree.last_status == "resampled" else None
    return Verification(tree.verdicts, residual, p[tree.kept_rows], tree=tree)
