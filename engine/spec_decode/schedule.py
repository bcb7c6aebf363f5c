"""How many tokens the next round drafts (`num_speculative_tokens_schedule`).

    schedule = make_schedule("acceptance", k)     # or "constant", "heuristic", "batch" (batch_schedule.py)
    schedule.k                                    # γ of the next round (0: no draft, a plain decode step)
    schedule.observe(num_drafted, num_accepted)   # after each round
    schedule.report()                             # what the status line says of it (None: nothing to say)

A schedule is a function of the acceptances it observed, never of time: the same rounds give the same γs. The
`batch` schedule is a function of the load instead: the sessions running on the model when a round starts.
"""
from __future__ import annotations

from typing import Callable

from .batch_schedule import BatchSchedule, load_table

MAX_NUM_SPECULATIVE_TOKENS = 16      # the setting's upper bound: a schedule never drafts more
SCHEDULES = ("constant", "heuristic", "acceptance", "batch")


def next_num_speculative_tokens(schedule: str, k: int, num_drafted: int, num_accepted: int) -> int:
    """γ for the next round after one that drafted `num_drafted` tokens and accepted `num_accepted`.

    - constant: γ as set;
    - heuristic (Hugging Face's assistant schedule): γ + 2 after a round that accepted every draft token,
      else γ - 1, within 1..MAX_NUM_SPECULATIVE_TOKENS. A round that drafted nothing leaves γ alone.
    """
    if schedule != "heuristic" or num_drafted == 0:
        return k
    return min(MAX_NUM_SPECULATIVE_TOKENS, k + 2) if num_accepted == num_drafted else max(1, k - 1)


class RuleSchedule:
    """`constant` and `heuristic`: γ from the last round alone (`next_num_speculative_tokens`)."""

    def __init__(self, name: str, k: int):
        self.name, self.k = name, k

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.k = next_num_speculative_tokens(self.name, self.k, num_drafted, num_accepted)

    def report(self) -> dict | None:
        return None


# SGLang's adaptive speculative decoding (`--speculative-adaptive`, its AdaptiveStepSlot): candidate γs, and a
# moving average of the draft tokens accepted a round that moves γ between them every few rounds
ACCEPTANCE_TIERS = (1, 3, 7)     # SGLang's candidate steps at one request; the setting's γ tops them
EMA_ALPHA = 0.2                  # the weight of the latest round in the moving average
WARMUP_ROUNDS = 5                # drafting rounds before γ first moves
UPDATE_INTERVAL = 5              # then rounds between two decisions
DOWN_HYSTERESIS = -0.25          # a tier t is left down when the average <= t_below - 0.5 + this
UP_HYSTERESIS = 0.0              # and up when the average > t - 0.5 + this
OFF_BELOW = 0.5                  # the zero tier's threshold: fewer draft tokens accepted a round than this
OFF_ROUNDS = 20                  # plain decode steps before speculation is probed again


class AcceptanceSchedule:
    """SGLang's rule, per session: γ among tiers 0 < 1 < 3 < 7 < the setting's γ (those below it), moved by an
    exponential moving average (EMA) of the draft tokens accepted a round.

    - Every UPDATE_INTERVAL drafting rounds (after WARMUP_ROUNDS), γ drops tier by tier while the average is at
      most the lower tier's t - 0.5 + DOWN_HYSTERESIS, or else climbs while it exceeds the current tier's
      t - 0.5 + UP_HYSTERESIS: a tier of t drafts pays while about t of them are accepted.
    - The zero tier turns speculation off: at most OFF_BELOW accepted a round means a verification (k + 1
      positions in one forward) costs more than the tokens it saves, where a few rows cost well over one
      (docs/benchmarks.md, `bench smollm2`); every round is then a plain decode step. After OFF_ROUNDS of them it
      probes the lowest positive tier for UPDATE_INTERVAL rounds, which decide as above.
    - A round that drafted nothing while γ > 0 (the drafter found nothing: no suffix match, say) cost no
      verification and says nothing of acceptance: it is not counted.

    Where ours differs from SGLang's: SGLang keeps one average per server (per batch size) over its whole life,
    started at γ - 1 and probed again at its next update; a session is short, so ours starts at the first drafting
    round's count, warms up for fewer rounds, and waits OFF_ROUNDS before a probe (on a CPU a probe round costs
    nearly a whole step more)."""
    name = "acceptance"

    def __init__(self, k: int, tiers=ACCEPTANCE_TIERS):
        if not 1 <= k <= MAX_NUM_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_NUM_SPECULATIVE_TOKENS}, got {k}")
        self.tiers = (0, *sorted(t for t in set(tiers) if 0 < t < k), k)
        self.k = k
        self.mean_accepted: float | None = None      # the EMA; None until a round has drafted
        self.rounds = 0                              # drafting rounds observed (plain ones while off: see below)
        self.off_rounds = 0                          # plain decode steps since speculation turned off
        self.probing = False
        self.why = "warmup"                          # warmup | steady | down | up | off | probe

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if self.k == 0:
            self.off_rounds += 1
            if self.off_rounds >= OFF_ROUNDS:        # probe the lowest positive tier
                self.k, self.probing, self.why, self.rounds = self.tiers[1], True, "probe", 0
            return
        if num_drafted == 0:
            return
        a = float(num_accepted)
        self.mean_accepted = a if self.mean_accepted is None else (1 - EMA_ALPHA) * self.mean_accepted + EMA_ALPHA * a
        self.rounds += 1
        first = WARMUP_ROUNDS if not self.probing else UPDATE_INTERVAL
        if self.rounds >= first and (self.rounds - first) % UPDATE_INTERVAL == 0:
            self._decide()

    def _decide(self) -> None:
        i = start = self.tiers.index(self.k)
        ema = self.mean_accepted
        while i > 0 and ema <= (OFF_BELOW if i == 1 else self.tiers[i - 1] - 0.5 + DOWN_HYSTERESIS):
            i -= 1
        if i == start:                               # no step down: a step up, as far as the average allows
            while i + 1 < len(self.tiers) and ema > self.tiers[i] - 0.5 + UP_HYSTERESIS:
                i += 1
        self.why = "steady" if self.tiers[i] == self.k else ("down" if self.tiers[i] < self.k else "up")
        self.k, self.probing = self.tiers[i], False
        if self.k == 0:
            self.why, self.off_rounds = "off", 0

    def report(self) -> dict:
        """The schedule's state for the status line: γ's tier and why it is there, the average it went by, the
        threshold below which speculation is off, and while off the plain steps left before the next probe."""
        return {"schedule": self.name, "why": self.why, "tiers": list(self.tiers),
                "mean_accepted": None if self.mean_accepted is None else round(self.mean_accepted, 3),
                "off_below": OFF_BELOW, "rounds_to_probe": OFF_ROUNDS - self.off_rounds if self.k == 0 else None}


def make_schedule(name: str, k: int, model_method: tuple[str, str] | None = None,
                  running: Callable[[], int] = lambda: 1):
    """The schedule `name` (one of SCHEDULES) starting at γ = k, the `num_speculative_tokens` setting; `batch` looks
    γ up in the table stored for (model, method) (batch_schedule.load_table; none: γ as set) at `running()`
    sessions on the model."""
    if name not in SCHEDULES:
        raise ValueError(f"num_speculative_tokens_schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if name == "batch":
        return BatchSchedule(k, load_table(*model_method) if model_method else None, running)
    return AcceptanceSchedule(k) if name == "acceptance" else RuleSchedule(name, k)
