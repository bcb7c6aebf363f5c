"""Verifying a token tree exactly, and block verification of a chain.

A round's draft is a tree (engine/spec_decode/draft.py): node i holds a token, its parent (-1: the root, the
context's last token) and q[i], the draft distribution its token was drawn from. The target scores the root
and every node in one forward, each node seeing the committed context and its own ancestors only
(`tree_mask`, `tree_positions`). p is then [n + 1, V]: row 0 the target's distribution after the root, row
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

Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding"; vLLM's
`rejection_sample_method: "block"`) is a second rule for a chain x_1..x_k. With b_0 = 1,
    b_i = min(1, b_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))                 (how far the prefix's joint ratio allows)
    m_i = sum_x max(0, b_i p_i(x) - q_i(x)),  h_i = m_i / (m_i + 1 - b_i)  for i < k,  h_k = b_k
draw eta_1..eta_k ~ U(0, 1), keep x_1..x_tau with tau = max{i : eta_i < h_i} (0 if none), then sample the last
token from norm(max(0, b_tau p_tau - q_tau)), or from p_k when tau = k (bonus). Row i of p and q is the
distribution of x_{i+1}. It emits the target's distribution too, and accepts at least as many tokens on average
as token-by-token verification of the same drafts (the paper proves it optimal; not on every draw).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import sample
from .verify import TokenVerdict, acceptance_probability, residual_distribution


def tree_mask(parents) -> np.ndarray:  # [n] -> [n, n] bool: mask[i, j] = node i sees node j
    """Tree attention among the draft's nodes: a node sees itself and its ancestors (and, outside this mask,
    the committed context and the root). A chain's mask is the causal (lower-triangular) one."""
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    for i, parent in enumerate(parents):        # topological order: a parent's row is complete before its child's
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def tree_depths(parents) -> np.ndarray:  # [n] -> [n], 1 for a child of the root
    depth = np.zeros(len(parents), np.int64)
    for i, parent in enumerate(parents):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    return depth


def tree_positions(parents, context_len: int) -> np.ndarray:  # [n] -> [n] positions for RoPE
    """A node's position is that of its token along its own path: context_len + depth, where context_len is
    the root's position (the tokens committed before it). Siblings share a position."""
    return context_len + tree_depths(parents)


def verification_positions(parents, root_position: int) -> np.ndarray:  # [n] -> [n + 1]
    """The RoPE positions of a tree's verification forward (engine.model.llama.forward's `positions`): the root
    at its own position, then each node at root_position + depth. A chain's are consecutive."""
    return np.concatenate([[root_position], tree_positions(parents, root_position)]).astype(np.int64)


def children_of(parents) -> dict[int, list[int]]:
    """node (-1: the root) -> its children in node order, the order in which verification tries them."""
    out: dict[int, list[int]] = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(i, [])
        out[parent].append(i)
    return out


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


def block_stop_probabilities(tokens, q, p):  # [k], [k, V], [k + 1, V] -> b [k + 1], h [k + 1]
    """Block verification's weights: b_i the prefix's capped joint ratio, h_i the probability that tau >= i may
    stop at i (h_0 = 1: tau = 0 when no later draw passes)."""
    k, x = len(tokens), np.asarray(tokens, np.int64)
    b = [1.0]
    for ratio in (p[np.arange(k), x] / q[np.arange(k), x]).tolist():
        b.append(min(1.0, b[-1] * ratio))
    b = np.array(b)
    m = np.maximum(b[1:k, None] * p[1:k] - q[1:k], 0.0).sum(-1)                  # [k - 1] residual masses
    denom = m + 1.0 - b[1:k]
    h = np.ones(k + 1)
    h[1:k] = np.where(denom > 0, m / np.where(denom > 0, denom, 1.0), 1.0)
    h[k] = b[k]                                                                  # h_k = b_k (h_0 = 1 when k = 0)
    return b, h


def block_residual(b_tau: float, p_row, q_row):  # [V], [V] -> [V]
    """norm(max(0, b_tau p - q)): where the last token comes from after keeping tau < k drafts (b_0 = 1: the
    standard residual). Falls back to p when it is empty (p == q exactly, which block verification never
    stops at but through a draw of probability 0)."""
    r = np.maximum(b_tau * p_row - q_row, 0.0)
    total = r.sum()
    return r / total if total > 0 else p_row


@dataclass
class BlockVerification:
    """A chain verified as a block: per position the weights, the draws and the verdicts, and what
    token-by-token verification would have accepted with the same draws."""
    b: np.ndarray                 # [k + 1] capped joint ratios (b_0 = 1)
    h: np.ndarray                 # [k + 1] stop probabilities (h_0 = 1)
    eta: np.ndarray               # [k] the uniform draws
    num_accepted: int             # tau
    verdicts: list[TokenVerdict]  # accepted x_1..x_tau, rejected x_{tau+1}..x_k, then the resampled or bonus token
    residual: np.ndarray | None   # [V] what a resampled token was drawn from (None for a bonus)
    standard_num_accepted: int    # token-by-token verification with r_i = eta_i: accept while eta_i < min(1, p/q)

    @property
    def emitted(self) -> list[int]:
        return [v.token_id for v in self.verdicts if v.status != "rejected"]


def verify_block(tokens, q, p, rng: np.random.Generator) -> BlockVerification:
    """Block verification of a chain x_1..x_k (temperature > 0; at temperature 0 it is greedy matching).
    tokens [k], q [k, V], p [k + 1, V]."""
    k = len(tokens)
    b, h = block_stop_probabilities(tokens, q, p)
    eta = rng.random(k)
    passed = np.flatnonzero(eta < h[1:])
    tau = int(passed[-1]) + 1 if len(passed) else 0
    rows = np.arange(k)
    px, qx = p[rows, tokens].tolist(), q[rows, tokens].tolist()
    verdicts = [TokenVerdict(int(x), "accepted" if i < tau else "rejected", px[i], qx[i], float(h[i + 1]),
                             float(eta[i]), i + 1) for i, x in enumerate(tokens)]
    if tau == k:
        residual, t = None, sample(p[k], rng)
        verdicts.append(TokenVerdict(t, "bonus", float(p[k, t]), None, None, None, k + 1))
    else:
        residual = block_residual(b[tau], p[tau], q[tau])
        t = sample(residual, rng)
        verdicts.append(TokenVerdict(t, "resampled", float(p[tau, t]), float(q[tau, t]), None, None, tau + 1))
    standard = 0                                    # token by token with the same draws: r_i = eta_i
    while standard < k and eta[standard] < acceptance_probability(px[standard], qx[standard]):
        standard += 1
    return BlockVerification(b, h, eta, tau, verdicts, residual, standard)
