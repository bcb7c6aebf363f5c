"""Speculative decoding: proposing draft tokens, and verifying them exactly against the target.

Notation follows Leviathan et al. (2023): p is the target's distribution, q the draft's, gamma (vLLM's
num_speculative_tokens) the number of draft tokens per round.

Verification of one round, given k draft tokens x_1..x_k with q_i(x_i) and the target's p_1..p_{k+1}
from one forward over k+1 positions:
- for i = 1..k: draw r ~ U(0, 1); accept x_i if r < min(1, p_i(x_i) / q_i(x_i))
- at the first rejection, sample from the residual norm(max(0, p_i - q_i)) and stop
- if all k are accepted, sample a bonus token from p_{k+1}
Every emitted token is then distributed exactly as p (Chen et al. 2023, Theorem 1). At temperature 0
p and q are point masses on their argmax, and the same rule becomes "accept while the draft token
equals the target's argmax, then emit the target's argmax".

That is the `standard` rule (vLLM's `rejection_sample_method`), token by token. The `block` rule (Sun et al.
2024, "Block Verification Accelerates Speculative Decoding") verifies the chain as a whole: it judges each
prefix x_1..x_i by the joint ratio of p and q along it, so one unlikely token no longer discards the drafts
after it for good. With b_0 = 1,
    b_i = min(1, b_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))                 (how far the prefix's joint ratio allows)
    m_i = sum_x max(0, b_i p_i(x) - q_i(x)),  h_i = m_i / (m_i + 1 - b_i)  for i < k,  h_k = b_k
draw eta_1..eta_k ~ U(0, 1), keep x_1..x_tau with tau = max{i : eta_i < h_i} (0 if none), then sample the last
token from norm(max(0, b_tau p_tau - q_tau)), or from p_k when tau = k (bonus). Row i of p and q is the
distribution of x_{i+1}. It emits the target's distribution too, and accepts at least as many tokens on average
as token-by-token verification of the same drafts (the paper proves it optimal; not on every draw). With one
draft token the two rules are the same, and at temperature 0 both are greedy matching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .draft import Draft
from .sampling import probs_from_logits, sample


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x) / q(x)); q(x) > 0 because the draft proposed x."""
    return 1.0 if p_x >= q_x else p_x / q_x


def residual_distribution(p, q):  # [V], [V] -> [V]
    """norm(max(0, p - q)): what to sample after a rejection. Falls back to p when p == q exactly."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def first_token_distribution(p, q):  # [V], [V] -> [V]
    """The exact distribution of a round's first emitted token, by enumerating the draft's choice.

    sum_x q(x) [a(x) delta_x + (1 - a(x)) residual] with a(x) = min(1, p(x)/q(x)). Equals p (Theorem 1).
    """
    out = np.zeros_like(p, dtype=np.float64)
    res = residual_distribution(p, q)
    for x in np.flatnonzero(q):
        a = acceptance_probability(p[x], q[x])
        out[x] += q[x] * a
        out += q[x] * (1 - a) * res
    return out


@dataclass
class TokenVerdict:
    """What happened to one position of a round."""
    token_id: int
    status: str               # accepted | rejected | resampled | bonus
    p: float                  # p(x) under the target (as shaped by temperature / top-p)
    q: float | None           # q(x) under the draft (None for target-only tokens)
    accept_prob: float | None  # min(1, p(x)/q(x)) for draft tokens
    r: float | None           # the uniform draw compared with accept_prob (None when greedy)
    position: int             # 1-based draft position; k+1 for the bonus
    stop_prob: float | None = None   # block verification's h_i, which r is compared with (None: token by token)


def verify(draft_tokens, q_probs, p_probs, rng: np.random.Generator) -> tuple[list[TokenVerdict], np.ndarray | None]:
    """Verify k draft tokens by rejection sampling (temperature > 0; temperature 0 is `verify_greedy`).
    q_probs: [k, V] the draft's distributions; p_probs: [k+1, V] the target's.

    Returns the verdicts in order (accepted..., then rejected + resampled, or a bonus) and, after a
    rejection, the residual distribution the replacement was drawn from (for the token inspector).
    """
    verdicts = []
    k = len(draft_tokens)
    for i, x in enumerate(draft_tokens):
        p, q = p_probs[i], q_probs[i]
        a = acceptance_probability(p[x], q[x])
        r = float(rng.random())
        accepted = r < a
        verdicts.append(TokenVerdict(int(x), "accepted" if accepted else "rejected", float(p[x]), float(q[x]),
                                     a, r, i + 1))
        if not accepted:
            res = residual_distribution(p, q)
            t = sample(res, rng)
            verdicts.append(TokenVerdict(t, "resampled", float(p[t]), float(q[t]), None, None, i + 1))
            return verdicts, res
    p = p_probs[k]
    t = sample(p, rng)
    verdicts.append(TokenVerdict(t, "bonus", float(p[t]), None, None, None, k + 1))
    return verdicts, None


def verify_greedy(draft_tokens, target_ids, vocab_size: int) -> tuple[list[TokenVerdict], np.ndarray | None]:
    """`verify` at temperature 0, from the target's argmax ids [k+1]: p and q are point masses, so the rule is
    a comparison of ids (no [k+1, V] distributions to build). The residual after a rejection is the point
    mass on the target's token."""
    verdicts = []
    for i, x in enumerate(draft_tokens):
        t = target_ids[i]
        if x == t:
            verdicts.append(TokenVerdict(int(x), "accepted", 1.0, 1.0, 1.0, None, i + 1))
            continue
        verdicts.append(TokenVerdict(int(x), "rejected", 0.0, 1.0, 0.0, None, i + 1))
        verdicts.append(TokenVerdict(int(t), "resampled", 1.0, 0.0, None, None, i + 1))
        residual = np.zeros(vocab_size)
        residual[t] = 1.0
        return verdicts, residual
    t = target_ids[len(draft_tokens)]
    verdicts.append(TokenVerdict(int(t), "bonus", 1.0, None, None, None, len(draft_tokens) + 1))
    return verdicts, None


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
    verdicts: list[TokenVerdict]  # accepted x_1..x_tau, rejected x_{tau+1}..x_k, then the resampled or bonus token;
    #                               each draft's accept_prob is min(1, p/q), its stop_prob h_i and its r eta_i
    residual: np.ndarray | None   # [V] what a resampled token was drawn from (None for a bonus)
    standard_num_accepted: int    # token-by-token verification with r_i = eta_i: accept while eta_i < min(1, p/q)
    # what each rule accepts on average over the draws, given these drafts: block's P(tau >= i) averaged over the
    # later drafts is b_i, token by token's is the product of min(1, p/q) up to i. b_i is never below that product,
    # so block's sum is never below standard's: the paper's claim, round by round, without the draws' noise
    expected_accepted: float
    standard_expected_accepted: float

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
    a = [acceptance_probability(px[i], qx[i]) for i in range(k)]
    verdicts = [TokenVerdict(int(x), "accepted" if i < tau else "rejected", px[i], qx[i], a[i], float(eta[i]), i + 1,
                             float(h[i + 1])) for i, x in enumerate(tokens)]
    if tau == k:
        residual, t = None, sample(p[k], rng)
        verdicts.append(TokenVerdict(t, "bonus", float(p[k, t]), None, None, None, k + 1))
    else:
        residual = block_residual(b[tau], p[tau], q[tau])
        t = sample(residual, rng)
        verdicts.append(TokenVerdict(t, "resampled", float(p[tau, t]), float(q[tau, t]), None, None, tau + 1))
    standard = 0                                    # token by token with the same draws: r_i = eta_i
    while standard < k and eta[standard] < a[standard]:
        standard += 1
    return BlockVerification(b, h, eta, tau, verdicts, residual, standard, float(b[1:].sum()),
                             float(np.cumprod(a).sum()))


class Verification(NamedTuple):
    """A round's verification: its verdicts in order, the residual a rejected token's replacement was drawn
    from (None without a rejection), and p, the target's sampling distributions [k+1, V] (None when greedy:
    the rule then compares ids). A block-verified round also carries its weights and draws, and what
    token-by-token verification would have accepted with them."""
    verdicts: list
    residual: np.ndarray | None
    p: np.ndarray | None
    block: BlockVerification | None = None     # a block-verified round's weights, draws and counterfactual
    tree: object = None         # a token tree's TreeVerification (engine/spec_decode/tree_verify.py); its p is then
    #                             the rows of the verdicts' positions: the root's, then the accepted path's

    @property
    def standard_num_accepted(self) -> int | None:
        """In a block-verified round, what token-by-token verification would have accepted with the same draws."""
        return self.block.standard_num_accepted if self.block is not None else None

    @property
    def num_accepted(self) -> int:
        return sum(v.status == "accepted" for v in self.verdicts)

    @property
    def emitted(self) -> list[int]:
        """The tokens the round adds to the output: the accepted drafts, then the replacement or bonus token."""
        return [v.token_id for v in self.verdicts if v.status != "rejected"]


def verify_draft(draft: Draft, logits, temperature: float, top_p: float, rng: np.random.Generator,
                 rejection_sample_method: str = "standard") -> Verification:
    """Verify a round's draft (a chain) from the target's logits [k+1, V] over the context's last token and the
    drafts: greedy matching at temperature 0, else rejection sampling by the `standard` rule (token by token) or
    the `block` rule. With nothing drafted this is plain decoding: one row, and the one token the target's own
    (status "target")."""
    if rejection_sample_method not in ("standard", "block"):
        raise ValueError(f"rejection_sample_method: standard or block, got {rejection_sample_method!r}")
    if not draft.is_chain:
        raise ValueError("a token tree is verified by tree_verify.verify_tree_draft")
    if temperature == 0:    # point masses on the argmax: verification compares ids, no distributions are built
        p = None
        verdicts, residual = verify_greedy(draft.tokens, logits.argmax(axis=-1).tolist(), logits.shape[-1])
    else:
        p = probs_from_logits(logits, temperature, top_p)
        if rejection_sample_method == "block" and draft:
            block = verify_block(draft.tokens, draft.q, p, rng)
            return Verification(block.verdicts, block.residual, p, block)
        verdicts, residual = verify(draft.tokens, draft.q, p, rng)
    if not draft:
        verdicts[0].status = "target"
    return Verification(verdicts, residual, p)

