"""Speculative-decoding and latency figures, with vLLM's definitions.

- acceptance_rate        = accepted draft tokens / draft tokens
- mean_acceptance_length = 1 + accepted draft tokens / drafts (rounds that proposed something)
- accepted_per_position  = how often draft position i (1-based) was accepted (vLLM's accepted_tokens_per_pos)
- ttft                   = engine time from start to the first output token (prefill + first sample)
- tpot                   = (elapsed - ttft) / (output tokens - 1)
- itl                    = engine time between consecutive deliveries of tokens (one per round)
All times are the engine's own: pauses, pacing and rendering between rounds are not counted.
"""
from __future__ import annotations

import bisect
from collections import defaultdict


def median_of_sorted(v: list[float]) -> float:
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


class SpecDecodeStats:
    def __init__(self):
        self.elapsed_s = 0.0
        self.ttft_s: float | None = None
        self.itl_total_s, self.itl_count = 0.0, 0
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_position: list[int] = []
        # block-verified rounds: their drafts, and the tokens block and token-by-token verification accepted on the
        # same draws, and accept on average over the draws (engine/spec_decode/verify.py)
        self.block_drafts = self.block_accepted = self.block_standard_accepted = 0
        self.block_expected = self.block_standard_expected = 0.0
        self.target_forward_calls = self.draft_forward_calls = 0
        self.target_s = self.draft_s = 0.0
        self.target_ms_by_tokens: dict[int, list[float]] = defaultdict(list)   # the verify-cost curve
        # the same times kept sorted: a summary is made every round, and a median over all steps so far
        # each time (a sort per round) cost a long generation quadratic time
        self._sorted_ms: dict[int, list[float]] = defaultdict(list)
        self.statuses: list[str] = []

    def add_engine_time(self, seconds: float, first_token: bool = False) -> None:
        self.elapsed_s += seconds
        if first_token:
            self.ttft_s = self.elapsed_s
        else:
            self.itl_total_s += seconds
            self.itl_count += 1

    def target_forward(self, ms: float, num_tokens: int, prefill: bool = False) -> None:
        self.target_forward_calls += 1
        self.target_s += ms / 1e3
        if not prefill:
            self.target_ms_by_tokens[num_tokens].append(ms)
            bisect.insort(self._sorted_ms[num_tokens], ms)

    def draft_forward(self, ms: float, calls: int) -> None:
        self.draft_forward_calls += calls
        self.draft_s += ms / 1e3

    def record_round(self, num_draft: int, num_accepted: int, block=None) -> None:
        """`block`: a block-verified round's BlockVerification (None otherwise)."""
        if block is not None:
            self.block_drafts += 1
            self.block_accepted += num_accepted
            self.block_standard_accepted += block.standard_num_accepted
            self.block_expected += block.expected_accepted
            self.block_standard_expected += block.standard_expected_accepted
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft:
            self.accepted_per_position += [0] * (num_draft - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def block_summary(self) -> dict:
        n = self.block_drafts
        return {"num_drafts": n, "mean_acceptance_length": 1 + self.block_accepted / n,
                "standard_mean_acceptance_length": 1 + self.block_standard_accepted / n,
                "expected_mean_acceptance_length": 1 + self.block_expected / n,
                "standard_expected_mean_acceptance_length": 1 + self.block_standard_expected / n}

    def emit(self, status: str) -> None:
        self.statuses.append(status)

    def summary(self, num_output_tokens: int) -> dict:
        ttft = self.ttft_s or 0.0
        step = self._sorted_ms.get(1)
        draft_step = self.draft_s * 1e3 / self.draft_forward_calls if self.draft_forward_calls else None
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            "mean_acceptance_length": 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None,
            "accepted_per_position": list(self.accepted_per_position),
            "block_verification": self.block_summary() if self.block_drafts else None,
            "target_forward_calls": self.target_forward_calls, "draft_forward_calls": self.draft_forward_calls,
            "target_time_s": self.target_s, "draft_time_s": self.draft_s,
            # c of Leviathan et al.: one draft step over one target step (needs plain target steps)
            "draft_cost_ratio": draft_step / median_of_sorted(step) if step and draft_step else None,
            "verify_ms_by_tokens": {n: median_of_sorted(v) for n, v in sorted(self._sorted_ms.items())},
            "elapsed_s": self.elapsed_s, "ttft_s": self.ttft_s,
            "tpot_s": (self.elapsed_s - ttft) / (num_output_tokens - 1) if num_output_tokens > 1 else None,
            "ttft_ms": ttft * 1e3, "itl_ms": self.itl_total_s / self.itl_count * 1e3 if self.itl_count else None,
            "tokens_per_s": num_output_tokens / self.elapsed_s if self.elapsed_s else None,
        }

    def token_statuses(self, tokenizer, token_ids) -> list[dict]:
        return [{"id": t, "text": tokenizer.token_text(t), "status": s} for t, s in zip(token_ids, self.statuses)]
