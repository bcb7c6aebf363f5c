"""The teaching faults of the seed article (the `fault` setting): a speculative round with one step done wrong.

Each fault replaces one hook of the correct round, `Round`, and leaves the math of the correct steps alone:
- `no_causal_mask`: the verification forward lets every draft position see the whole draft, its own future
  included, so the target's p for a draft position is computed from tokens that follow it;
- `no_truncate`: after verification the rejected drafts' K/V stay in the target's cache, so every later
  position is computed against keys of tokens that were never output;
- `unnormalized_residual`: a rejected token's replacement is drawn from max(0, p - q) as it is, and numpy
  refuses to sample from weights that do not sum to 1.
engine/experiments/traces.py runs each beside a correct run and shows where they part.
"""
from __future__ import annotations

import numpy as np

from .draft import Draft
from .tree_verify import verify_tree_draft
from .verify import Verification, verify_draft


class Round:
    """The hooks of a speculative round that a teaching fault may replace, done right."""
    name = "none"

    def verification_mask(self, draft: Draft):  # -> [k+1, k+1] or None (the causal mask)
        """Which verification positions each position sees: the draft's own ancestors only."""
        return draft.attention_mask()

    def verify(self, draft: Draft, logits, temperature: float, top_p: float, rng,
               rejection_sample_method: str = "standard") -> Verification:
        if not draft.is_chain:       # a tree (the settings pair one with no fault and the standard rule only)
            return verify_tree_draft(draft, logits, temperature, top_p, rng)
        return verify_draft(draft, logits, temperature, top_p, rng, rejection_sample_method)

    def truncate(self, runner, num_tokens: int) -> None:
        """Drop the K/V of the rejected drafts: the cache holds the first `num_tokens` tokens' K/V."""
        runner.truncate(num_tokens)


class NoCausalMask(Round):
    name = "no_causal_mask"

    def verification_mask(self, draft: Draft):
        if not draft:            # one position sees itself either way: the plain step's own (batchable) forward
            return None
        return np.zeros((len(draft) + 1, len(draft) + 1), np.float32)     # every position sees every one


class NoTruncate(Round):
    name = "no_truncate"

    def truncate(self, runner, num_tokens: int) -> None:
        pass                     # the rejected drafts' K/V stay in the cache, at positions the output reuses


class UnnormalizedResidual(Round):
    name = "unnormalized_residual"

    def verify(self, draft: Draft, logits, temperature: float, top_p: float, rng,
               rejection_sample_method: str = "standard") -> Verification:
        """The correct verification, then the faulty draw from max(0, p - q) where there was a rejection: numpy
        checks the weights before it draws, and refuses (ValueError: probabilities do not sum to 1). Asked on
        a generator of its own, so where numpy accepts (weights within its tolerance of 1) the session's
        random stream is as the correct draw left it. (Block verification's residual, max(0, b p - q), is no
        more normalised: the same weights show the same refusal.)"""
        result = super().verify(draft, logits, temperature, top_p, rng, rejection_sample_method)
        if result.residual is not None and result.p is not None:       # a rejection while sampling
            i = result.verdicts[-1].position - 1
            weights = np.maximum(result.p[i] - draft.q[i], 0.0)
            np.random.default_rng(0).choice(len(weights), p=weights)
        return result


TEACHING_FAULTS = {fault.name: fault for fault in (Round(), NoCausalMask(), NoTruncate(), UnnormalizedResidual())}
