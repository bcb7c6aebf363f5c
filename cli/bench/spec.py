"""The speculative-decoding part of `bench engine`: the first seed's k x temperature sweep.

For every (k, temperature): 8 prompts (the first 16 characters of held-out lines) x 96 tokens, run with
the draft model and with plain decoding, in the same run, repeated and interleaved; reported with the
seed's columns plus two predictions:
- flat-verify bound (Leviathan et al., Theorem 3.8): E / (k c + 1), as if verifying k+1 tokens cost one step;
- curve prediction: E / (k c + t(k+1)/t(1)), with the forward times measured in the same runs: t(1) from the
  plain decoding runs, t(k+1) and the draft step (c = draft step / t(1)) from the speculative runs, as means
  within each repeat; the prediction of each repeat, then their median (as the measured speedup: the median
  of each repeat's ratio);
where E = (1 - a^(k+1)) / (1 - a) is the expected number of tokens per target call at acceptance a. What the
measured speedup loses against the curve prediction is what the session spends besides the models.

NOTE: a forward inside a generation costs more than the same call repeated in a loop (the isolated curve
printed with the sweep): other work between the calls leaves the CPU's caches and predictors cold. The
prediction uses the in-run times so that it states the models' cost as they actually ran.
"""
from __future__ import annotations

import statistics

import numpy as np

from engine.experiments.measure import curve_at, verify_curve
from engine.experiments.theory import expected_tokens_per_round
from engine.serving.registry import InferenceEngine
from engine.serving.session import GenerationSession

KS = (1, 2, 3, 4, 6, 8)
# n-gram lookup's k: its proposals cost nothing, so its best k is where the verify curve is cheapest per token
# (t(4) ~ 1.5 t(1) but t(5) ~ 2.2 t(1) here: OpenBLAS multiplies 4 rows well, 5 badly; docs/benchmarks.md)
NGRAM_KS = (2, 3, 4, 5, 6)
NGRAM_PAIRS_PER_PASS = 3
TEMPERATURES = (0.0, 0.7, 1.0)
# A prompt that repeats itself, whose continuation the target also repeats for a while (the 6-layer target
# writes "import sys" six times, then wanders off; a prompt whose continuation wanders off at once, such as
# repeated method definitions or assignments, gets ~0.4 acceptance here).
REPEATING_PROMPT = "import os\nimport os\nimport os\nimport os\nimport os\n"
NON_REPEATING_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    parser = "


def held_out_prompts(n: int = 8, length: int = 16) -> list[str]:
    """The first `length` characters of n evenly spaced lines of the validation split (files never trained on)."""
    from engine.training.corpus import VAL_EVERY, stdlib_files
    lines = []
    for i, f in enumerate(stdlib_files()):
        if i % VAL_EVERY == VAL_EVERY - 1:
            lines += [ln for ln in f.read_text(encoding="utf-8", errors="replace").splitlines()
                      if len(ln) >= length and ln.isascii() and ln[:length].strip()]
    idx = np.linspace(0, len(lines) - 1, n).astype(int)
    return [lines[i][:length] for i in idx]


def run_prompts(engine, prompts, max_tokens, **settings):
    """-> (engine seconds, summaries) for one pass over the prompts."""
    total, summaries = 0.0, []
    for p in prompts:
        session = GenerationSession(engine, p, {"max_tokens": max_tokens, **settings})
        events = list(session.events())
        if events[-1].type != "done":
            raise RuntimeError(events[-1].message)
        s = events[-1].summary
        s["target_ms_by_tokens"] = session.stats.target_ms_by_tokens     # every forward's time, for means
        total += s["elapsed_s"]
        summaries.append(s)
    return total, summaries


def sweep(engine: InferenceEngine, quick: bool) -> dict:
    target = engine.registry.default_target()
    draft = engine.registry.draft_for(target)
    curve = verify_curve(target, repeats=7 if quick else 21)
    draft_step = verify_curve(draft, ns=(1,), repeats=7 if quick else 21)[1]
    c = draft_step / curve[1]
    prompts = held_out_prompts()[:2 if quick else 8]
    # 9 interleaved passes: with 5, the medians moved by ~10% from one run of the bench to the next
    max_tokens, repeats = (32, 1) if quick else (96, 9)
    ks = (2, 4) if quick else KS
    temps = (0.0,) if quick else TEMPERATURES
    by_temperature = []
    for temp in temps:
        base_runs, spec_runs = [], {k: [] for k in ks}     # per repeat: the summaries of its generations
        for _ in range(repeats):    # prompt by prompt: the baseline, then every k, so that noise hits all alike
            base_sum, spec_sum = [], {k: [] for k in ks}
            for prompt in prompts:
                base_sum += run_prompts(engine, [prompt], max_tokens, method="none", temperature=temp)[1]
                for k in ks:
                    spec_sum[k] += run_prompts(engine, [prompt], max_tokens, method="draft_model", temperature=temp,
                                               num_speculative_tokens=k)[1]
            base_runs.append(base_sum)
            for k in ks:
                spec_runs[k].append(spec_sum[k])
        base_t = statistics.median(elapsed(run) for run in base_runs)
        t1 = statistics.median(in_run_ms(run, 1) for run in base_runs)
        rows = [_draft_model_row(k, spec_runs[k], base_runs, temp, c, curve) for k in ks]
        by_temperature.append({"temperature": temp, "baseline_s": base_t, "t1_in_run_ms": t1,
                               "baseline_tok_s": len(prompts) * max_tokens / base_t, "rows": rows})
    ngram = _ngram_sweep(engine, max_tokens, repeats)
    return {"target": target.name, "draft": draft.name, "c": c, "draft_step_ms": draft_step,
            "verify_curve_ms": curve, "verify_curve_ratio": {n: v / curve[1] for n, v in curve.items()},
            "prompts": prompts, "max_tokens": max_tokens, "repeats": repeats, "by_temperature": by_temperature, "ngram": ngram}


def _draft_model_row(k: int, runs: list, base_runs: list, temp: float, c: float, curve: dict) -> dict:
    """One k of the draft-model sweep at one temperature: its figures from the summaries of every repeat
    (`runs`, beside the baselines of the same repeats)."""
    s = runs[-1]     # counts from the last repeat
    # each repeat's in-run figures and prediction, then their median, as for the measured speedup (the
    # median of each repeat's ratio: a prompt's baseline runs right before its speculative runs)
    c_runs = [sum(x["draft_time_s"] for x in run) * 1e3 / sum(x["draft_forward_calls"] for x in run)
              / in_run_ms(base, 1) for run, base in zip(runs, base_runs)]
    v_runs = [in_run_ms(run, k + 1) / in_run_ms(base, 1) for run, base in zip(runs, base_runs)]
    c_run, v_run = statistics.median(c_runs), statistics.median(v_runs)
    accepted = sum(x["num_accepted_tokens"] for x in s)
    proposed = sum(x["num_draft_tokens"] for x in s)
    drafts = sum(x["num_drafts"] for x in s)
    # rounds that ended in a rejection: every judged-and-rejected token stops its round
    rejected = sum(x["num_drafts"] for x in s) - sum(
        sum(1 for t in x["tokens"] if t["status"] == "bonus") for x in s)
    alpha = accepted / (accepted + rejected) if accepted + rejected else 0.0
    out_tokens = sum(x["num_output_tokens"] for x in s)
    target_calls = sum(x["target_forward_calls"] - 1 for x in s)    # minus the prefill
    e = expected_tokens_per_round(alpha, k)
    return {
        "k": k, "alpha": alpha, "accepted_per_proposed": accepted / proposed,
        "mean_acceptance_length": 1 + accepted / drafts,
        "tokens_per_target_call": out_tokens / target_calls, "formula_E": e,
        "flat_verify_bound": e / (k * c_run + 1),
        "c_in_run": c_run, "verify_ratio_in_run": v_run,
        "curve_prediction": statistics.median(e / (k * cr + vr) for cr, vr in zip(c_runs, v_runs)),
        "isolated_curve_prediction": e / (k * c + curve_at(curve, k + 1) / curve[1]),
        "speedup": statistics.median(elapsed(b) / elapsed(r) for b, r in zip(base_runs, runs)),
        "identical_to_greedy": [x["text"] for x in s] == [x["text"] for x in base_runs[-1]] if temp == 0 else None,
    }


def _ngram_sweep(engine: InferenceEngine, max_tokens: int, repeats: int) -> list[dict]:
    """n-gram lookup at every k on a prompt that repeats itself and one that does not."""
    ngram = []
    for name, prompt in (("repeating", REPEATING_PROMPT), ("non_repeating", NON_REPEATING_PROMPT)):
        ratios, last = {k: [] for k in NGRAM_KS}, {}
        # each k beside its own baseline run (two generations of ~50 ms): this VM's speed drifts (t(1) measured
        # 0.42-0.85 ms within one hour), and a ratio of neighbours cancels the drift that one baseline for five
        # ks let in; 3x the sweep's passes, as one pair is short and noisy (~0.1 s)
        for _ in range(NGRAM_PAIRS_PER_PASS * repeats):
            for k in NGRAM_KS:
                tb, base = run_prompts(engine, [prompt], max_tokens, method="none")
                ts, last[k] = run_prompts(engine, [prompt], max_tokens, method="ngram", num_speculative_tokens=k,
                                          prompt_lookup_min=2, prompt_lookup_max=4)
                ratios[k].append(tb / ts)
        rows = [{"k": k, "speedup": statistics.median(ratios[k]),
                 "acceptance_rate": last[k][0]["acceptance_rate"],
                 "mean_acceptance_length": last[k][0]["mean_acceptance_length"],
                 "verify_ratio_in_run": in_run_ms(last[k], k + 1) / in_run_ms(base, 1)
                 if last[k][0]["target_ms_by_tokens"].get(k + 1) else None,
                 "identical_to_greedy": last[k][0]["text"] == base[0]["text"]} for k in NGRAM_KS]
        best = max(rows, key=lambda r: r["speedup"])
        ngram.append({"prompt": name, "best_k": best["k"], "speedup": best["speedup"], "rows": rows})
    return ngram


def elapsed(summaries) -> float:
    """Engine seconds of one pass over the prompts."""
    return sum(x["elapsed_s"] for x in summaries)


def in_run_ms(summaries, n: int) -> float:
    """Mean ms of the target forwards over n positions in these generations (a mean, as the measured speedup
    is a ratio of total times: a median would leave out the slow calls that the totals include)."""
    times = [t for s in summaries for t in s["target_ms_by_tokens"].get(n, [])]
    return sum(times) / len(times)


def markdown(r: dict) -> str:
    ratio = r["verify_curve_ratio"]
    lines = [f"Target `{r['target']}`, draft `{r['draft']}`. In a loop of the same call (isolated): one draft step "
             f"{r['draft_step_ms']:.3f} ms, c = {r['c']:.2f}; verify-cost curve t(n)/t(1) at a 100-token context: "
             + ", ".join(f"{n}: {v:.2f}" for n, v in ratio.items())
             + f" (t(1) = {r['verify_curve_ms'][1]:.3f} ms). The curve prediction uses the forward times measured "
               "in the runs themselves (columns c and t(k+1)/t(1) in run); the isolated curve's prediction is shown "
               "beside it.", "",
             f"{len(r['prompts'])} prompts (first 16 characters of held-out lines) x {r['max_tokens']} tokens; "
             f"{r['repeats']} interleaved passes; speedup: the median of each pass's ratio (a prompt's plain run, "
             "then its speculative runs).", ""]
    for t in r["by_temperature"]:
        lines += [f"Temperature {t['temperature']}: baseline {t['baseline_s']:.2f} s ({t['baseline_tok_s']:.0f} tok/s), "
                  f"t(1) in run {t['t1_in_run_ms']:.3f} ms.",
                  "", "| k | alpha | accepted/proposed | tokens/target call | formula E | c in run | t(k+1)/t(1) in run "
                  "| flat-verify bound | curve prediction | isolated-curve prediction | measured speedup "
                  "| identical to greedy |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in t["rows"]:
            ident = "" if row["identical_to_greedy"] is None else str(row["identical_to_greedy"])
            lines.append(f"| {row['k']} | {row['alpha']:.3f} | {row['accepted_per_proposed']:.3f} | "
                         f"{row['tokens_per_target_call']:.2f} | {row['formula_E']:.2f} | {row['c_in_run']:.2f} | "
                         f"{row['verify_ratio_in_run']:.2f} | {row['flat_verify_bound']:.2f}x | "
                         f"{row['curve_prediction']:.2f}x | {row['isolated_curve_prediction']:.2f}x | "
                         f"{row['speedup']:.2f}x | {ident} |")
        lines.append("")
    lines += ["n-gram prompt lookup (prompt_lookup_min 2, max 4), temperature 0, each prompt x "
              f"{r['max_tokens']} tokens; speedup: the median over {NGRAM_PAIRS_PER_PASS * r['repeats']} pairs of a "
              "plain run's time over "
              "the n-gram run's right after it; the goal row takes the repeating prompt at its best k:", "",
              "| prompt | k | acceptance rate | mean acceptance length | t(k+1)/t(1) in run | speedup | identical to greedy |",
              "|---|---|---|---|---|---|---|"]
    for n in r["ngram"]:
        for row in n["rows"]:
            ratio = "" if row["verify_ratio_in_run"] is None else f"{row['verify_ratio_in_run']:.2f}"
            best = " (best)" if row["k"] == n["best_k"] else ""
            lines.append(f"| {n['prompt']} | {row['k']}{best} | {row['acceptance_rate'] or 0:.3f} | "
                         f"{row['mean_acceptance_length'] or 1:.2f} | {ratio} | {row['speedup']:.2f}x | "
                         f"{row['identical_to_greedy']} |")
    return "\n".join(lines)
