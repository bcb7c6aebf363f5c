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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .sampling import probs_from_logits, sample

if TYPE_CHECKING:              # draft.py builds on tree_verify.py, which builds on this module
    from .draft import Draft


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


class Verification(NamedTuple):
    """A round's verification: its verdicts in order, the residual a rejected token's replacement was drawn
    from (None without a rejection), and p, the target's sampling distributions [k+1, V] (None when greedy:
    the rule then compares ids)."""
    verdicts: list
    residual: np.ndarray | None
    p: np.ndarray | None

    @property
    def num_accepted(self) -> int:
        return sum(v.status == "accepted" for v in self.verdicts)

    @property
    def emitted(self) -> list[int]:
        """The tokens the round adds to the output: the accepted drafts, then the replacement or bonus token."""
        return [v.token_id for v in self.verdicts if v.status != "rejected"]


def verify_draft(draft: Draft, logits, temperature: float, top_p: float, rng: np.random.Generator) -> Verification:
    """Verify a round's draft (a chain) from the target's logits [k+1, V] over the context's last token and the
    drafts: greedy matching at temperature 0, else rejection sampling. With nothing drafted this is plain
    decoding: one row, and the one token the target's own (status "target")."""
    if not draft.is_chain:
        raise NotImplementedError("verifying a token tree: only chains are drafted")
    if temperature == 0:    # point masses on the argmax: verification compares ids, no distributions are built
        p = None
        verdicts, residual = verify_greedy(draft.tokens, logits.argmax(axis=-1).tolist(), logits.shape[-1])
    else:
        p = probs_from_logits(logits, temperature, top_p)
        verdicts, residual = verify(draft.tokens, draft.q, p, rng)
    if not draft:
        verdicts[0].status = "target"
    return Verification(verdicts, residual, p)


def ngram_propose(context, k: int, min_n: int, max_n: int) -> np.ndarray:
    """Prompt lookup, vLLM's `ngram` rule: find the longest suffix n-gram (max_n down to min_n) that also
    occurs earlier in the context, and propose the (up to) k tokens that followed its earliest earlier
    occurrence (vLLM's `_find_longest_matched_ngram_and_propose_tokens`; tests/e2e/vllm_live check it live).
    Returns an empty array when nothing matches.
    """
    # One character per token id (str holds any id below 0x110000), so that str.find, a C loop, finds the
    # earliest earlier occurrence: several times faster than comparing numpy windows of the context.
    ids = [int(t) for t in context]
    text, L = "".join(map(chr, ids)), len(ids)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        start = text.find(text[L - n:], 0, L - 1)      # a match that ends before the last token
        if start >= 0:
            return np.array(ids[start + n:start + n + k], dtype=np.int64)
    return np.zeros(0, dtype=np.int64)
