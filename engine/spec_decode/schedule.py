"""How many tokens the next round drafts (`num_speculative_tokens_schedule`)."""
from __future__ import annotations

MAX_NUM_SPECULATIVE_TOKENS = 16      # the setting's upper bound: a schedule never drafts more


def next_num_speculative_tokens(schedule: str, k: int, num_drafted: int, num_accepted: int) -> int:
    """γ for the next round after one that drafted `num_drafted` tokens and accepted `num_accepted`.

    - constant: γ as set;
    - heuristic (Hugging Face's assistant schedule): γ + 2 after a round that accepted every draft token,
      else γ - 1, within 1..MAX_NUM_SPECULATIVE_TOKENS. A round that drafted nothing leaves γ alone.
    """
    if schedule != "heuristic" or num_drafted == 0:
        return k
    return min(MAX_NUM_SPECULATIVE_TOKENS, k + 2) if num_accepted == num_drafted else max(1, k - 1)
