"""Speculative decoding measured in fresh generations (`bench engine`'s sweep): the draft model at k x
temperature, n-gram lookup at every k; predictions from the same runs beside them (docs/benchmarks.md).
"""
from __future__ import annotations

import statistics

import numpy as np

from cli.bench.lib import generation, paired, shown, table
from engine.experiments.measure import curve_at, verify_curve
from engine.experiments.theory import expected_tokens_per_round
from engine.serving.registry import InferenceEngine

KS = (1, 2, 3, 4, 6, 8)
NGRAM_KS = (2, 3, 4, 5, 6)     # its proposals cost nothing: its best k is where the verify curve is cheapest a token
NGRAM_PAIRS_PER_PASS = 3        # an n-gram pair is short and noisy: three for every pass of the sweep
TEMPERATURES = (0.0, 0.7, 1.0)
# A prompt that repeats itself, whose continuation the target also repeats for a while (a prompt whose continuation
# wanders off at once, such as repeated method definitions, gets far less acceptance).
REPEATING_PROMPT = "import os\nimport os\nimport os\nimport os\nimport os\n"
NON_REPEATING_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    parser = "


def run(engine, prompt: str, settings: dict) -> dict:
    """One fresh generation: its summary, with its wall seconds and the target's forward times by row count."""
    wall, s, session = generation(engine, prompt, settings)
    return {**s, "wall_s": wall, "target_ms_by_tokens": dict(session.stats.target_ms_by_tokens)}


def by_prompt(run_one, prompts: list, sides: dict, repeats: int) -> dict:
    """{side: one list of `run_one(prompt, side, settings)` a repeat}: per repeat and prompt, every side in turn."""
    out = {name: [] for name in sides}
    for _ in range(repeats):
        for runs in out.values():
            runs.append([])
        for p in prompts:
            for name, settings in sides.items():
                out[name][-1].append(run_one(p, name, settings))
    return out


def in_run_ms(summaries, n: int, upto: int | None = None) -> float | None:
    """Mean ms of the target's forwards over n (to `upto`) rows in these generations."""
    times = [t for s in summaries for rows in range(n, (upto or n) + 1) for t in s["target_ms_by_tokens"].get(rows, [])]
    return sum(times) / len(times) if times else None


def figures(k: int, runs: list, base_runs: list, nodes: int | None = None) -> dict:
    """A setting's figures from its runs and the plain runs of the same repeats (k: its depth; nodes: the most
    it verifies, a tree's budget, default k)."""
    last = runs[-1]
    drafts, accepted = sum(x["num_drafts"] for x in last), sum(x["num_accepted_tokens"] for x in last)
    # rounds that ended in a rejection: every judged-and-rejected token stops its round
    rejected = drafts - sum(t["status"] == "bonus" for x in last for t in x["tokens"])
    calls = sum(x["draft_forward_calls"] for x in last)
    t1 = [in_run_ms(b, 1) for b in base_runs]
    c = [sum(x["draft_time_s"] for x in r) * 1e3 / max(1, sum(x["draft_forward_calls"] for x in r)) / t
         for r, t in zip(runs, t1)]
    v = [(in_run_ms(r, 2, (nodes or k) + 1) or in_run_ms(r, 1)) / t for r, t in zip(runs, t1)]

    def speedup(key):
        return paired([sum(x[key] for x in b) for b in base_runs], [sum(x[key] for x in r) for r in runs])
    return {"k": k, "drafts": drafts, "alpha": accepted / (accepted + rejected) if accepted + rejected else 0.0,
            "accepted_per_proposed": accepted / max(1, sum(x["num_draft_tokens"] for x in last)),
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "acceptance_per_position": [sum((x["accepted_per_position"] + [0] * k)[i] for x in last) / drafts
                                        for i in range(k)] if drafts else [],
            "tokens_per_target_call": sum(x["num_output_tokens"] for x in last)
            / sum(x["target_forward_calls"] - 1 for x in last),                       # minus the prefill
            "draft_calls_per_round": calls / drafts if drafts else 0.0, "nodes_per_round": sum(
                x["num_draft_tokens"] for x in last) / drafts if drafts else 0.0,
            "plain_steps": sum(len(x["target_ms_by_tokens"].get(1, [])) for x in last),   # nothing proposed (n-gram)
            "c_runs": c, "v_runs": v, "c": statistics.median(c) if calls else 0.0, "v": statistics.median(v),
            "speedup": speedup("elapsed_s"), "decode_speedup": speedup("tpot_s"), "wall_speedup": speedup("wall_s"),
            "identical": [x["text"] for x in last] == [x["text"] for x in base_runs[-1]]}


def held_out_prompts(n: int = 8, length: int = 16) -> list[str]:
    """The first `length` characters of n evenly spaced lines of the validation split (files never trained on)."""
    from engine.training.corpus import VAL_EVERY, stdlib_files
    lines = []
    for i, f in enumerate(stdlib_files()):
        if i % VAL_EVERY == VAL_EVERY - 1:
            lines += [ln for ln in f.read_text(encoding="utf-8", errors="replace").splitlines()
                      if len(ln) >= length and ln.isascii() and ln[:length].strip()]
    return [lines[i][:length] for i in np.linspace(0, len(lines) - 1, n).astype(int)]


def sweep(engine: InferenceEngine, quick: bool) -> dict:
    target = engine.registry.default_target()
    draft = engine.registry.draft_for(target)
    curve = verify_curve(target, repeats=7 if quick else 21)
    draft_step = verify_curve(draft, ns=(1,), repeats=7 if quick else 21)[1]
    c = draft_step / curve[1]
    prompts = held_out_prompts()[:2 if quick else 8]
    max_tokens, repeats = (32, 1) if quick else (96, 9)      # with 5 passes the medians moved by ~10% between runs
    by_temperature = []
    for temp in (0.0,) if quick else TEMPERATURES:
        sides = {0: {"method": "none"}, **{k: {"method": "draft_model", "num_speculative_tokens": k}
                                           for k in ((2, 4) if quick else KS)}}
        runs = by_prompt(lambda p, k, s: run(engine, p, {**s, "max_tokens": max_tokens, "temperature": temp}),
                         prompts, sides, repeats)
        base = runs.pop(0)
        rows = []
        for k, r in runs.items():
            x = figures(k, r, base)
            e = expected_tokens_per_round(x["alpha"], k)
            x.update(formula_E=e, flat_verify_bound=e / (k * x["c"] + 1),
                     curve_prediction=statistics.median(e / (k * c_ + v) for c_, v in zip(x["c_runs"], x["v_runs"])),
                     isolated_curve_prediction=e / (k * c + curve_at(curve, k + 1) / curve[1]))
            x["identical"] = x["identical"] if temp == 0 else None
            rows.append(x)
        by_temperature.append({"temperature": temp, "t1_in_run_ms": statistics.median(in_run_ms(b, 1) for b in base),
                               "baseline_tok_s": len(prompts) * max_tokens
                               / statistics.median(sum(x["elapsed_s"] for x in b) for b in base), "rows": rows})
    return {"target": target.name, "draft": draft.name, "c": c, "draft_step_ms": draft_step, "verify_curve_ms": curve,
            "prompts": prompts, "max_tokens": max_tokens, "repeats": repeats, "by_temperature": by_temperature,
            "ngram": ngram_sweep(engine, max_tokens, NGRAM_PAIRS_PER_PASS * repeats)}


def ngram_sweep(engine: InferenceEngine, max_tokens: int, repeats: int) -> list[dict]:
    """n-gram lookup at every k, each beside a plain run of its own, on a repeating and a plain prompt."""
    out = []
    for name, prompt in (("repeating", REPEATING_PROMPT), ("non_repeating", NON_REPEATING_PROMPT)):
        sides = {(k, m): {"method": "none"} if m == "none" else
                 {"method": m, "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
                 for k in NGRAM_KS for m in ("none", "ngram")}
        runs = by_prompt(lambda p, _, s: run(engine, p, {**s, "max_tokens": max_tokens}), [prompt], sides, repeats)
        rows = [figures(k, runs[k, "ngram"], runs[k, "none"]) for k in NGRAM_KS]
        out.append({"prompt": name, "best_k": max(rows, key=lambda x: x["speedup"]["median"])["k"], "rows": rows})
    return out


def tables(r: dict) -> list[str]:
    curve = ", ".join(f"{n}: {v / r['verify_curve_ms'][1]:.2f}" for n, v in r["verify_curve_ms"].items())
    out = [table(["target", "draft", "draft step ms", "c", "t(1) ms", "t(n)/t(1), isolated", "prompts x tokens",
                  "passes"],
                 [[f"`{r['target']}`", f"`{r['draft']}`", f"{r['draft_step_ms']:.3f}", r["c"],
                   f"{r['verify_curve_ms'][1]:.3f}", curve, f"{len(r['prompts'])} x {r['max_tokens']}", r["repeats"]]],
                 "Speculative decoding: the draft model and the verify-cost curve in a loop of the same call")]
    out.append(table(   # one table for every temperature: the columns are the same, the rows few
        ["T", "k", "alpha", "accepted/proposed", "tokens/target call", "formula E", "c in run", "t(k+1)/t(1) in run",
         "flat-verify bound", "curve prediction", "isolated-curve prediction", "measured speed-up",
         "identical to greedy"],
        [[t["temperature"] if i == 0 else "", x["k"], f"{x['alpha']:.3f}", f"{x['accepted_per_proposed']:.3f}",
          x["tokens_per_target_call"], x["formula_E"], x["c"], x["v"], f"{x['flat_verify_bound']:.2f}x",
          f"{x['curve_prediction']:.2f}x", f"{x['isolated_curve_prediction']:.2f}x", shown(x["speedup"]),
          x["identical"]] for t in r["by_temperature"] for i, x in enumerate(t["rows"])],
        "Draft model, by temperature T (plain decoding: " + ", ".join(
            f"T {t['temperature']} {t['baseline_tok_s']:.0f} tok/s, t(1) in run {t['t1_in_run_ms']:.3f} ms"
            for t in r["by_temperature"]) + ")"))
    return out + [table(
        ["prompt", "k", "mean acceptance length", "t(k+1)/t(1) in run", "speed-up", "identical to greedy"],
        [[n["prompt"], f"{x['k']}{' (best)' if x['k'] == n['best_k'] else ''}", x["mean_acceptance_length"], x["v"],
          shown(x["speedup"]), x["identical"]] for n in r["ngram"] for x in n["rows"]],
        f"n-gram lookup (prompt_lookup_min 2, max 4), temperature 0, {NGRAM_PAIRS_PER_PASS * r['repeats']} pairs")]
