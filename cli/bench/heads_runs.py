"""`bench heads`' runs: fresh generations of SmolLM2 as `generate` runs them, per thread count, the figures read from
them (cli/bench/spec.py), and the demo's best EAGLE setting per thread count (models/heads/smollm2-135m/demo.json).
"""
from __future__ import annotations

import json
import statistics
from contextlib import nullcontext
from pathlib import Path

from cli.bench.spec import by_prompt, figures, in_run_ms, run
from engine.model.threads import using_threads

NAME = "smollm2-135m"
DEMO_FILE = "demo.json"
TIE = 0.01          # speed-ups this close are one run's noise apart


def generate(engine, prompt, max_tokens, **settings) -> dict:
    """One fresh generation of SmolLM2 as `generate` runs it, chat, greedy (cli/bench/spec.py's `run`)."""
    return run(engine, prompt, {"model": NAME, "chat": True, "temperature": 0, "max_tokens": max_tokens,
                                "enable_prefix_caching": False, **settings})


def config(method: str, k: int, q: float = 0.0) -> tuple[str, dict]:
    """(label, settings) of a method at γ = k (with a confidence threshold q: at most k, stopping below q)."""
    return (f"{method} γ≤{k}, q≥{q}" if q else f"{method} γ={k}",
            {"method": method, "num_speculative_tokens": k, **({"draft_confidence_threshold": q} if q else {})})


def measure(engine, prompts, max_tokens, repeats, cfgs, counts=(None,)) -> dict:
    """{thread count: its figures}: per repeat and prompt, plain decoding first, then every config in turn."""
    sides = {(t, name): s for t in counts for name, s in [("plain", {"method": "none"}), *cfgs]}

    def one(prompt, side, settings):
        with using_threads(side[0]) if side[0] else nullcontext():
            return generate(engine, prompt, max_tokens, **settings)
    runs = by_prompt(one, prompts, sides, repeats)
    out = {}
    for t in counts:
        plain, rows = runs[t, "plain"], []
        for name, s in cfgs:
            x = figures(s["num_speculative_tokens"], runs[t, name], plain)
            per_round = x["draft_calls_per_round"] * x["c"] + x["v"]
            rows.append({**x, "config": name, "method": s["method"], "gamma": s["num_speculative_tokens"],
                         "confidence": s.get("draft_confidence_threshold", 0.0),
                         "predicted": (x["drafts"] * x["mean_acceptance_length"] + x["plain_steps"])
                         / (x["drafts"] * per_round + x["plain_steps"]),
                         "measured": x["decode_speedup"]["median"], "measured_wall": x["wall_speedup"]["median"]})
        out[t] = {"t1_ms": statistics.median(in_run_ms(b, 1) for b in plain), "rows": rows,
                  "plain_ids": [tok["id"] for x in plain[-1] for tok in x["tokens"]]}
    return out


def best_row(rows: list[dict], current: dict | None = None) -> dict | None:
    """The fastest EAGLE setting with identical output; the one in use stays unless beaten by more than TIE."""
    eagle = [x for x in rows if x["method"] == "eagle" and x["identical"]]
    best = max(eagle, key=lambda x: x["measured"], default=None)
    kept = [x for x in eagle if current and (x["gamma"], x.get("confidence", 0.0)) ==
            (current["num_speculative_tokens"], current["draft_confidence_threshold"])]
    if best and kept and kept[0]["measured"] * (1 + TIE) >= best["measured"]:
        return kept[0]
    return best


def current_defaults(folder: Path) -> dict[int, dict]:
    """The demo's settings per thread count as last recorded (`record_defaults`)."""
    f = folder / DEMO_FILE
    return {int(t): e for t, e in json.loads(f.read_text())["by_threads"].items()} if f.is_file() else {}


def record_defaults(folder: Path, date: str, best_by_threads: dict[int, dict]) -> dict:
    """Store the best EAGLE setting per thread count in `folder`/demo.json (what the page's demo opens with)."""
    f = folder / DEMO_FILE
    data = json.loads(f.read_text()) if f.is_file() else {"by_threads": {}}
    for t, row in best_by_threads.items():
        if row is None:
            continue
        data["by_threads"][str(t)] = {
            "num_speculative_tokens": row["gamma"],
            "draft_confidence_threshold": row.get("confidence", 0.0),
            "decode_speedup": round(row["measured"], 3), "measured": f"bench heads, {date}, {row['config']}"}
    f.write_text(json.dumps(data, indent=1) + "\n")
    return data
