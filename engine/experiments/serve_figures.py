"""What a run of many clients at once measured (cli/bench/served.py's `many`): tokens/s over the run's wall time,
errors, TTFT / ITL percentiles, TPOT, mean acceptance length, and repeats of such runs merged."""
from __future__ import annotations

import statistics


def merge(runs: list[dict]) -> dict:
    """Repeats of `many`: the median run's tokens/s, errors summed, latencies pooled."""
    tps = [r["tokens_per_s"] for r in runs if r["tokens_per_s"]]
    out = dict(runs[0])
    out.update(repeats=len(runs), errors=sum(r["errors"] for r in runs),
               error_messages=sorted({m for r in runs for m in r["error_messages"]})[:5],
               tokens_per_s=statistics.median(tps) if tps else None, tokens_per_s_all=tps,
               ttft_s=pcts([x for r in runs for x in r["_ttft"]]), itl_s=pcts([x for r in runs for x in r["_itl"]]),
               tpot_s=statistics.median([r["tpot_s"] for r in runs if r["tpot_s"]] or [0]) or None,
               output_tokens=sum(r["output_tokens"] for r in runs),
               mean_acceptance_length=statistics.median([r["mean_acceptance_length"] for r in runs
                                                         if r["mean_acceptance_length"]] or [0]) or None)
    out.pop("_ttft"), out.pop("_itl"), out.pop("texts", None)
    return out


def figures(n: int, results: list[dict]) -> dict:
    """n clients that started together: tokens/s, errors, TTFT, ITL, TPOT, mean acceptance length."""
    ok = [r for r in results if r["ok"]]
    wall = (max(r["done_at"] for r in ok) - min(r["started_at"] for r in ok)) if ok else None
    tokens = sum(r["tokens"] for r in ok)
    itl = [x for r in ok for x in r["itl_s"]]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    mal = [r["mean_acceptance_length"] for r in ok if r.get("mean_acceptance_length")]
    return {"clients": n, "errors": n - len(ok), "error_messages": sorted({r["error"] for r in results
                                                                            if r["error"]})[:5],
            "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else None,
            "ttft_s": pcts(ttft), "itl_s": pcts(itl), "tpot_s": statistics.mean(tpot) if tpot else None,
            "mean_acceptance_length": statistics.mean(mal) if mal else None, "_ttft": ttft, "_itl": itl,
            "texts": [r.get("text") if r["ok"] else None for r in results]}      # each client's answer (workloads)


def pcts(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None, "n": 0}
    xs = sorted(xs)
    return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))], "max": xs[-1], "n": len(xs)}


def ms(x):
    return None if x is None else x * 1e3


def p50_p99(d: dict) -> str:
    """A `pcts` of seconds as a table shows it: 'p50 / p99' in ms."""
    return " / ".join("–" if d[k] is None else f"{d[k] * 1e3:.1f}" for k in ("p50", "p99"))


def over_best_fixed(rows: list[dict], fixed, adaptive) -> dict[tuple, float | None]:
    """A sweep's adaptive γ schedules against its fixed γs ("none", no speculation, among them): per (schedule,
    concurrency) its tokens/s over the fastest fixed γ's at that concurrency (None: a cell failed or is missing)."""
    by = {(x["gamma"], x["concurrency"]): x["tokens_per_s"] for x in rows}
    out = {}
    for a, c in sorted({(g, c) for g, c in by if g in adaptive}, key=lambda k: (adaptive.index(k[0]), k[1])):
        best = max((by.get((g, c)) or 0 for g in fixed), default=0)
        out[a, c] = by[a, c] / best if by[a, c] and best else None
    return out
