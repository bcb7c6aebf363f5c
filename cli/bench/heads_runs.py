"""`bench heads`' runs and their figures: fresh generations of SmolLM2 as `generate` runs them, and the speed-ups,
acceptance, c and v that `bench heads` and its thread part read from them (the method: cli/bench/heads.py)."""
from __future__ import annotations

import statistics
import time

from engine.serving.session import GenerationSession


NAME = "smollm2-135m"


def generate(engine, prompt, max_tokens, **settings) -> tuple[float, dict, dict]:
    """One fresh generation as `generate` runs it: (wall seconds, summary, forward times by row count)."""
    t = time.perf_counter()
    session = GenerationSession(engine, prompt, {"model": NAME, "chat": True, "temperature": 0,
                                                 "max_tokens": max_tokens, "enable_prefix_caching": False, **settings})
    events = list(session.events())
    wall = time.perf_counter() - t
    if events[-1].type != "done":
        raise RuntimeError(events[-1].message)
    return wall, events[-1].summary, dict(session.stats.target_ms_by_tokens)


def mean_ms(runs, n, upto=None):
    """Mean forward ms over `runs` of the target's forwards over n rows (n to `upto` rows)."""
    v = [ms for r in runs for rows in range(n, (upto or n) + 1) for ms in r[2].get(rows, [])]
    return sum(v) / len(v) if v else None


def measure(engine, prompts, max_tokens, repeats, cfgs) -> dict:
    plain, spec = [], {name: [] for name, _ in cfgs}           # per repeat: [(wall, summary, times) per prompt]
    for _ in range(repeats):
        plain.append([])
        for name, _ in cfgs:
            spec[name].append([])
        for p in prompts:
            plain[-1].append(generate(engine, p, max_tokens, method="none"))
            for name, s in cfgs:
                spec[name][-1].append(generate(engine, p, max_tokens, **s))
    return summarize(plain, spec, cfgs)


def summarize(plain, spec, cfgs) -> dict:
    """`measure`'s figures from its runs: per repeat, [(wall, summary, times) per prompt], plain and per config."""
    t1 = statistics.median(mean_ms(r, 1) for r in plain)
    rows = []
    for name, s in cfgs:
        k, last = s["num_speculative_tokens"], spec[name][-1]
        drafts = sum(x[1]["num_drafts"] for x in last)
        accepted = sum(x[1]["num_accepted_tokens"] for x in last)
        rejected = drafts - sum(sum(t["status"] == "bonus" for t in x[1]["tokens"]) for x in last)
        per_pos = [sum(x[1]["accepted_per_position"][i] if i < len(x[1]["accepted_per_position"]) else 0
                       for x in last) / drafts for i in range(k)] if drafts else []
        calls = sum(x[1]["draft_forward_calls"] for x in last)
        c = [sum(x[1]["draft_time_s"] for x in r) * 1e3 / max(1, sum(x[1]["draft_forward_calls"] for x in r))
             / mean_ms(b, 1) for r, b in zip(spec[name], plain)]
        # a round verifies its drafts + 1 rows: γ + 1, fewer near the end or when the drafter stopped early
        v = [(mean_ms(r, 2, k + 1) or mean_ms(r, 1)) / mean_ms(b, 1) for r, b in zip(spec[name], plain)]
        mal = 1 + accepted / drafts if drafts else 1.0
        c_med, v_med = statistics.median(c), statistics.median(v)
        calls_per_round = calls / drafts if drafts else 0.0
        plain_steps = sum(len(x[2].get(1, [])) for x in last)      # decode steps with nothing proposed (n-gram)
        ratios = [sum(x[0] for x in b) / sum(x[0] for x in r) for r, b in zip(spec[name], plain)]
        decode = [sum(x[1]["tpot_s"] for x in b) / sum(x[1]["tpot_s"] for x in r) for r, b in zip(spec[name], plain)]
        rows.append({"config": name, "method": s["method"], "gamma": k, "mean_acceptance_length": mal,
                     "acceptance_per_position": per_pos, "alpha": accepted / (accepted + rejected) if accepted + rejected else 0,
                     "c": c_med if calls else 0.0, "verify_ratio": v_med,
                     "confidence": s.get("draft_confidence_threshold", 0.0), "draft_calls_per_round": calls_per_round,
                     "predicted": (drafts * mal + plain_steps)
                     / (drafts * (calls_per_round * (c_med if calls else 0.0) + v_med) + plain_steps),
                     "measured": statistics.median(decode),
                     "measured_wall": statistics.median(ratios),
                     "identical": [x[1]["text"] for x in last] == [x[1]["text"] for x in plain[-1]]})
    return {"t1_ms": t1, "rows": rows, "plain_ids": [t["id"] for x in plain[-1] for t in x[1]["tokens"]]}
