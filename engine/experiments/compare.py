"""One way to measure a speed-up, used by everything that shows one: the Race, the Shoot-out, the Theory view's
"Measure against plain decoding" and the bench commands.

    comparison_steps(engine, prompt, {"plain": {...}, "eagle": {...}}) -> Job[dict]   (the first side is the reference)
    compare(engine, prompt, sides, repeats)                         -> the same, run to its end

The method:
- each side first runs once untimed, a few tokens: its weights, KV pools and code paths are warm;
- then rounds, each running every side once, in order and in reverse order by turns (A B, B A, A B: ABBA...),
  so that a drift of the machine (load coming and going) hits every side alike: `repeats` of them, or by
  default at least 3 and more while the rounds so far took less than ROUNDS_BUDGET_S of engine time (at most
  MAX_REPEATS): a small model's runs take milliseconds and differ by ±20% from one to the next on a shared
  machine, a large model's take seconds and differ by a few percent;
- every timed run starts from the same prefix-cache state, an empty one: prefix caching is off in them, so each
  computes its whole prompt, as `generate` does in a fresh process;
- one clock: each run's engine time (engine/serving/clock.py) per output token, the prefill included, as
  `generate` reports tokens/s;
- a side's speed-up in a round is the reference's ms per token in that round over the side's; reported are the
  median of the rounds' speed-ups and their spread: the range of the rounds' values that holds the median with
  at least 75% confidence (`median_band`: the lowest and highest of 3 rounds, the 5th to the 11th of 15, so that
  one run slowed by the machine does not decide);
- one verdict rule (`speed_verdict`), from that spread alone: "faster" when it lies wholly above 1 + VERDICT_FLOOR,
  "slower" when wholly below 1 / (1 + VERDICT_FLOOR), otherwise "no clear difference here". The sides' own
  run-to-run noise is not added on top: the rounds are paired so that it cancels, and their spread is what is
  left of it.
"""
from __future__ import annotations

import math
import os
import statistics
from typing import Callable

from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.settings import GenerationSettings, SettingsError
from .traces import trace_steps

MIN_REPEATS = 3
MAX_REPEATS = 15
ROUNDS_BUDGET_S = 3.0   # engine time of the timed rounds past which no round beyond MIN_REPEATS is added
# A speed-up closer to 1 than this is not called either way, however tight its rounds: what the pairing cannot
# cancel (which side's caches are warmer, a bias the same in every round) is of that order, and two identical
# settings must say "no clear difference here".
VERDICT_FLOOR = 0.05
WARM_UP_TOKENS = 8
NO_CLEAR_DIFFERENCE = "no clear difference here"


def comparison_steps(engine: InferenceEngine, prompt: str, sides: dict[str, dict], repeats: int | None = None,
                     with_times: bool = False, run_ms: Callable[[dict], float | None] | None = None) -> Job[dict]:
    """The sides' settings (`name -> settings`, the first the reference) compared by the method above (`repeats`
    rounds; None: by the budget). Bad settings raise here, when the job is made. with_times: every run also keeps
    its forwards' times. run_ms: a run's ms per output token, asked as each run ends (default `ms_per_token`, the
    run's engine clock); a test passes its own to control the timing it checks."""
    if len(sides) < 2:
        raise SettingsError("compare", "at least two sides")
    if repeats is not None and repeats < MIN_REPEATS:
        raise SettingsError("repeats", f"at least {MIN_REPEATS}, got {repeats}")
    timed = {}
    for name, settings in sides.items():
        s = GenerationSettings.parse({k: v for k, v in settings.items() if k != "fault"}).model_dump()
        timed[name] = {**s, "enable_prefix_caching": False}
    return _compare(engine, prompt, timed, repeats, with_times, run_ms or ms_per_token)


def compare(engine: InferenceEngine, prompt: str, sides: dict[str, dict], repeats: int | None = None,
            with_times: bool = False, run_ms: Callable[[dict], float | None] | None = None) -> dict:
    return run_to_end(comparison_steps(engine, prompt, sides, repeats, with_times, run_ms))


def _compare(engine, prompt: str, sides: dict[str, dict], repeats: int | None, with_times: bool,
             run_ms: Callable[[dict], float | None]) -> Job[dict]:
    names = list(sides)
    load_before = os.getloadavg()
    for name in names:                                  # warm, untimed
        s = sides[name]
        yield from trace_steps(engine, prompt, {**s, "max_tokens": min(WARM_UP_TOKENS, s["max_tokens"])})
    runs: dict[str, list] = {name: [] for name in names}
    ms: dict[str, list] = {name: [] for name in names}
    order, spent_ms, rounds = [], 0.0, 0
    while more_rounds(rounds, spent_ms, repeats):
        for name in (names if rounds % 2 == 0 else names[::-1]):
            order.append(name)
            run = yield from trace_steps(engine, prompt, sides[name], with_times)
            runs[name].append(run)
            ms[name].append(run_ms(run))
            spent_ms += run["elapsed_ms"]
        rounds += 1
    reference = names[0]
    out = {"reference": reference, "repeats": rounds, "order": order,
           "load_average": [round(x, 2) for x in load_before], "load_average_after": [round(x, 2) for x in os.getloadavg()],
           "cores": os.cpu_count(), "sides": {}}
    for name in names:
        side = {"settings": sides[name], "runs": runs[name], "ms_per_token": ms[name],
                "median_ms_per_token": statistics.median(ms[name]) if None not in ms[name] else None,
                "run": runs[name][median_index(ms[name])],
                "error": next((r["error"] for r in runs[name] if r["error"]), None)}
        if name != reference:      # round by round: the reference's ms per token over this side's
            side["speedup"] = speedup([a / b if a and b else None for a, b in zip(ms[reference], ms[name])], rounds)
        out["sides"][name] = side
    return out


def more_rounds(rounds: int, spent_ms: float, repeats: int | None) -> bool:
    """Whether a comparison runs another round: `repeats` of them, or by the budget (see the module's note)."""
    if repeats is not None:
        return rounds < repeats
    return rounds < MIN_REPEATS or (rounds < MAX_REPEATS and spent_ms < ROUNDS_BUDGET_S * 1e3)


def abba_order(names: list, repeats: int) -> list:
    """Every name once per round, in order and in reverse order by turns: A B, B A, A B, ..."""
    return [name for r in range(repeats) for name in (names if r % 2 == 0 else names[::-1])]


def ms_per_token(run: dict) -> float | None:
    n = run["num_output_tokens"]
    return run["elapsed_ms"] / n if n and run["elapsed_ms"] and not run["error"] else None


def median_index(values: list) -> int:
    """The index of a median value (the lower of the two middle ones for an even count; 0 without values)."""
    ranked = sorted((v, i) for i, v in enumerate(values) if v is not None)
    return ranked[(len(ranked) - 1) // 2][1] if ranked else 0


def median_band(values: list) -> tuple[float, float]:
    """The k-th lowest and k-th highest of n values, k as large as keeps the median between them with at least
    75% confidence (a distribution-free interval: P(median outside) = 2 P(Binomial(n, 1/2) < k))."""
    ranked, n, k = sorted(values), len(values), 1
    while k + 1 <= n // 2 and 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n <= 0.25:
        k += 1
    return ranked[k - 1], ranked[n - k]


def speed_verdict(low: float, high: float) -> str:
    """The one verdict rule on a speed-up's spread (the paired rounds' `median_band`): "faster" when it lies wholly
    above 1 + VERDICT_FLOOR, "slower" when wholly below 1 / (1 + VERDICT_FLOOR), else NO_CLEAR_DIFFERENCE.
    Decided on the figures as `speedup_text` prints them (two decimals), so that the line never says other than
    its numbers."""
    above, below = floor_band()
    if round(low, 2) > above:
        return "faster"
    if round(high, 2) < below:
        return "slower"
    return NO_CLEAR_DIFFERENCE


def floor_band() -> tuple[float, float]:
    """The speed-ups too close to 1 to call, as printed: (1 + VERDICT_FLOOR, 1 / (1 + VERDICT_FLOOR))."""
    return round(1 + VERDICT_FLOOR, 2), round(1 / (1 + VERDICT_FLOOR), 2)


def speedup(ratios: list, pairs: int) -> dict:
    """Speed-ups of the paired rounds (None where a run failed): median, spread, verdict and a line saying them."""
    if not ratios or None in ratios:
        return {"values": ratios, "median": None, "low": None, "high": None, "verdict": None,
                "text": "not measured: a run failed"}
    (low, high), median = median_band(ratios), statistics.median(ratios)
    verdict = speed_verdict(low, high)
    return {"values": ratios, "median": median, "low": low, "high": high, "verdict": verdict,
            "text": speedup_text(median, low, high, verdict, pairs)}


def speedup_text(median: float, low: float, high: float, verdict: str, pairs: int) -> str:
    """'1.31× faster (1.27–1.36× over 3 interleaved rounds)', '1.40× slower (…)', 'no clear difference here (1.03×;
    0.98–1.08× over 3 interleaved rounds, not clear of 0.95–1.05×)'."""
    spread = f"{low:.2f}–{high:.2f}× over {pairs} interleaved rounds"
    if verdict == "faster":
        return f"{median:.2f}× faster ({spread})"
    if verdict == "slower":
        return f"{1 / median:.2f}× slower ({spread})"
    above, below = floor_band()
    return f"{NO_CLEAR_DIFFERENCE} ({median:.2f}×; {spread}, not clear of {below:.2f}–{above:.2f}×)"


def against_plain_steps(engine: InferenceEngine, prompt: str, settings: dict, repeats: int | None = None) -> Job[dict]:
    """The Theory view's "Measure against plain decoding": these settings against the same with method none
    (the reference). The speed-up is the "run" side's, with its median and spread."""
    return comparison_steps(engine, prompt, {"plain": {**settings, "method": "none"}, "run": settings}, repeats)


def against_plain_figures(c: dict) -> dict:
    """What the view shows of such a comparison: both sides' median ms per token, the speed-up (median, spread,
    verdict and its line), whether both wrote the same text, the repeats and the load."""
    plain, run = c["sides"]["plain"], c["sides"]["run"]
    return {"plain_ms_per_token": plain["median_ms_per_token"], "run_ms_per_token": run["median_ms_per_token"],
            **{k: run["speedup"][k] for k in ("median", "low", "high", "verdict", "text")},
            "same_text": plain["run"]["emitted_ids"] == run["run"]["emitted_ids"], "repeats": c["repeats"],
            "load_average": c["load_average"], "cores": c["cores"], "error": plain["error"] or run["error"]}
