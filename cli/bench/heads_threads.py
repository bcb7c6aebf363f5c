"""`bench heads`' thread part: EAGLE's best γ and confidence threshold per thread count, and the defaults the
page's SmolLM2 demo takes from them (models/heads/smollm2-135m/demo.json, engine/spec_decode/heads.py).

`--compare-threads` runs plain decoding and a sweep of EAGLE settings at 1 and at N threads, interleaved (per
prompt, every count in turn: a shared machine's noise hits each alike), each run a fresh generation as in the
rest of `bench heads`. More threads speed a step's weight products up (engine/model/threads.py); whether
speculation gains or loses by it depends on how the verification of γ + 1 rows (v = t(γ+1)/t(1)) and the
head's drafting (c) scale against the one-token step: the table shows both per count, and says which way v went.
"""
from __future__ import annotations

import json
from pathlib import Path

from cli.bench.heads_runs import generate, summarize
from engine.model.threads import using_threads

CONFIDENCE_SWEEP = [(3, 0.0), (3, 0.5), (5, 0.5), (7, 0.5), (5, 0.3)]       # (γ or its cap, threshold)
QUICK_SWEEP = [(3, 0.0), (5, 0.5)]
DEMO_FILE = "demo.json"


def sweep(quick: bool) -> list[tuple[str, dict]]:
    out = []
    for k, q in QUICK_SWEEP if quick else CONFIDENCE_SWEEP:
        s = {"method": "eagle", "num_speculative_tokens": k}
        if q:
            s["draft_confidence_threshold"] = q
        out.append((f"eagle γ={k}" if not q else f"eagle γ≤{k}, q≥{q}", s))
    return out


def compare(engine, prompts, max_tokens: int, repeats: int, counts, quick: bool = False) -> dict:
    """{count: bench heads' figures (`summarize`) for the sweep at that many threads}, the counts interleaved."""
    cfgs = sweep(quick)
    runs = {t: ([], {name: [] for name, _ in cfgs}) for t in counts}
    for _ in range(repeats):
        for plain, spec in runs.values():
            plain.append([])
            for name in spec:
                spec[name].append([])
        for p in prompts:
            for t, (plain, spec) in runs.items():
                with using_threads(t):
                    plain[-1].append(generate(engine, p, max_tokens, method="none"))
                    for name, s in cfgs:
                        spec[name][-1].append(generate(engine, p, max_tokens, **s))
    out = {t: summarize(plain, spec, cfgs) for t, (plain, spec) in runs.items()}
    for r in out.values():
        r.pop("plain_ids", None)
    return out


TIE = 0.01          # speed-ups this close are one run's noise apart


def best_row(rows: list[dict], current: dict | None = None) -> dict | None:
    """The EAGLE setting with the highest measured decode speed-up among those with identical output; the one in
    use (`current`, a demo.json entry) stays unless another beats it by more than TIE (no flip-flop on noise)."""
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


def markdown(r: dict) -> list[str]:
    counts = sorted(r)
    lines = ["", "**EAGLE per thread count** (`--compare-threads`: open questions, the counts interleaved; plain "
             "decoding's one-token forward: " + ", ".join(f"{r[t]['t1_ms']:.1f} ms at {t} thread{'s' * (t > 1)}"
                                                          for t in counts) + ")", "",
             "| config | " + " | ".join(f"{t} thr.: L / c / v / speed-up" for t in counts) + " |",
             "|---|" + "---|" * len(counts)]
    for i, row in enumerate(r[counts[0]]["rows"]):
        cells = []
        for t in counts:
            x = r[t]["rows"][i]
            cells.append(f"{x['mean_acceptance_length']:.2f} / {x['c']:.3f} / {x['verify_ratio']:.2f} / "
                         f"{x['measured']:.2f}x{'' if x['identical'] else ' (output differs)'}")
        lines.append(f"| {row['config']} | " + " | ".join(cells) + " |")
    lines.append("")
    best = {t: best_row(r[t]["rows"]) for t in counts}
    for t in counts:
        if best[t]:
            lines.append(f"Best at {t} thread{'s' * (t > 1)}: {best[t]['config']}, {best[t]['measured']:.2f}x.")
    if len(counts) > 1 and all(best.values()):
        a, b = counts[0], counts[-1]
        same = {x["config"]: x for x in r[b]["rows"]}
        row_a = best[a]
        row_b = same[row_a["config"]]
        change = row_b["verify_ratio"] / row_a["verify_ratio"] - 1
        way = "about the same" if abs(change) < TIE else "cheaper" if change < 0 else "dearer"
        lines.append(f"At {row_a['config']}, verification costs {row_a['verify_ratio']:.2f} one-token steps at {a} "
                     f"thread{'s' * (a > 1)} and {row_b['verify_ratio']:.2f} at {b}: {way} relative to a step; "
                     f"drafting c {row_a['c']:.3f} -> {row_b['c']:.3f}.")
    return lines + [""]


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
