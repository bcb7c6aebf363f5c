"""`decoding-playground bench smollm2`: the pretrained model's speed, taking turns: the floor, the verify cost
curve, a prefill, a step's breakdown, n-gram against plain in fresh generations (as bench heads runs its heads);
with --threads N, 1 .. N threads and `generate`.
"""
from __future__ import annotations

import copy
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from cli.bench.lib import (add_bench, by_key, forward_after, generate_process, goals, paired, paired_rates,
                           pooled, shown, table, take_turns, timer)
from cli.bench.spec import by_prompt, figures, in_run_ms, run
from engine.experiments.tree_shapes import drafting, verified_nodes
from engine.kv.cache import KVCacheManager
from engine.model.checkpoint import load_checkpoint
from engine.model.fetched import cache_dir, fetched_models, is_fetched
from engine.model.layout import LAYOUTS, PanelWeight, WeightStream, use_layout, weights_of
from engine.model.llama import Model, attention, forward, rms_norm_vector, swiglu
from engine.model.thread_choice import request_threads
from engine.model.threads import read_chunked, set_threads, threads, using_threads
from engine.serving.registry import InferenceEngine, ModelRegistry

NAME = "smollm2-135m"
GOALS = {"decode_over_floor": ("decode step (context 256) / floor, medians", "<=", 1.25),
         "decode_tokens_per_s": ("decode, tokens/s (context 256)", ">=", 25.0),
         "ngram_summary_speedup": ("`ngram` speed-up, summarisation, T=0, identical output", ">=", 1.3),
         "threads_decode_speedup": ("`generate` tokens/s, 2 threads over 1", ">=", 1.25),
         "threads_decode_over_floor": ("`generate` step at 2 threads / the 2-thread floor", "<=", 1.25)}
SUMMARY_PROMPT = (
    "Summarize the following paragraph in two sentences.\n\n"
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
    "and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square "
    "kilometres. The reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen "
    "from outer space and is the world's biggest single structure made by living organisms. This reef structure "
    "is composed of and built by billions of tiny organisms, known as coral polyps. It supports a wide diversity "
    "of life and was selected as a World Heritage Site in 1981.")
QUESTION_PROMPT = "What are three good habits for staying healthy?"
GENERATE_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NGRAM = dict(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4)
CONTEXT = 256
ROWS = tuple(range(1, 10))
CHARACTER_MODEL = Path(__file__).resolve().parents[2] / "models" / "target-mha"
LAYOUT_LABELS = {"panels": "64-column panels [in, out]", "out_in": "[out, in], 256-row blocks"}


def generate(engine, prompt, max_tokens, **settings) -> dict:
    """One fresh generation of SmolLM2 as `generate` runs it, chat, greedy (spec.py's `run`)."""
    return run(engine, prompt, {"model": NAME, "chat": True, "temperature": 0, "max_tokens": max_tokens,
                                "enable_prefix_caching": False, **settings})


def config(method: str, k: int, q: float = 0.0) -> tuple[str, dict]:
    """(label, settings) of a method at γ = k (with a confidence threshold q: at most k, stopping below q)."""
    return (f"{method} γ≤{k}, q≥{q}" if q else f"{method} γ={k}",
            {"method": method, "num_speculative_tokens": k, **({"draft_confidence_threshold": q} if q else {})})


def against_plain(engine, prompts, max_tokens, repeats, cfgs, counts=(None,)) -> dict:
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
            x = figures(s["num_speculative_tokens"], runs[t, name], plain, verified_nodes(s))
            per_round = x["draft_calls_per_round"] * x["c"] + x["v"]
            rows.append({**x, "config": name, "method": s["method"], **drafting(s), "predicted": (x["drafts"] * x["mean_acceptance_length"] + x["plain_steps"])
                         / (x["drafts"] * per_round + x["plain_steps"]),
                         "measured": x["decode_speedup"]["median"], "measured_wall": x["wall_speedup"]["median"]})
        out[t] = {"t1_ms": statistics.median(in_run_ms(b, 1) for b in plain), "rows": rows,
                  "plain_ids": [tok["id"] for x in plain[-1] for tok in x["tokens"]]}
    return out


def ms(fn) -> float:
    return timer(fn)()[0]


def step_costs(models: dict, tokens, repeats: int) -> dict:
    """ms per (layout, n rows), (layout, 'prefill') and ('floor', how), taking turns."""
    streams = {"read": WeightStream(next(iter(models.values()))).read}
    if "out_in" in models:
        streams["gemv"] = WeightStream(models["out_in"]).gemv

    def side(name, model):
        rows = forward_after(model, tokens, CONTEXT)
        mgr = KVCacheManager(model.cfg, num_blocks=CONTEXT // 16 + 2, block_size=16, enable_prefix_caching=False)

        def prefill() -> None:          # a CONTEXT-token prefill into an empty cache, freed after
            seq = mgr.new_sequence()
            forward(model, tokens[:CONTEXT], 0, mgr.append_slots(seq, tokens[:CONTEXT]))
            mgr.free(seq)
        return lambda: {**{("floor", how): ms(fn) for how, fn in streams.items()},
                        **{(name, n): ms(lambda: rows(n)) for n in ROWS}, (name, "prefill"): ms(prefill)}
    turns = take_turns({name: side(name, model) for name, model in models.items()}, repeats)
    return by_key([r for results in turns.values() for r in results])


def generate_tokens_per_s(threads_: int, prompt: str = GENERATE_PROMPT, max_tokens: int = 64, **settings) -> dict:
    """A fresh `generate --threads N` process, greedy: decode tokens/s (1 / TPOT) and its text."""
    s = generate_process(prompt, {"model": NAME, "chat": True, "max_tokens": max_tokens, "temperature": 0,
                                  "enable_prefix_caching": False, "method": "none", "threads": threads_, **settings})
    return {"tokens_per_s": 1.0 / s["tpot_s"], "text": s["text"]}


def run_threads(model, tokens, counts, repeats: int, generate_repeats: int) -> dict:
    """Per thread count, taking turns: the floor, the verify curve and our character model's step in this process
    (the count set with set_threads), then fresh `generate --threads T` processes."""
    rows, flat = forward_after(model, tokens, CONTEXT), WeightStream(model).flat
    cfg, weights, _ = load_checkpoint(CHARACTER_MODEL, with_tokenizer=False)   # our character model: no threads used
    character_rows = forward_after(Model(cfg, weights), np.random.default_rng(0).integers(2, cfg.vocab_size, 101), 100)

    def turn(c):
        pool = set_threads(c)
        return {"read": ms(lambda: read_chunked(flat, pool)), **{n: ms(lambda: rows(n)) for n in ROWS},
                "character": ms(lambda: [character_rows(1) for _ in range(50)]) / 50}
    before = threads()
    try:
        times = {c: by_key(v) for c, v in take_turns({c: lambda c=c: turn(c) for c in counts}, repeats).items()}
    finally:
        set_threads(before)
    gen = take_turns({c: lambda c=c: generate_tokens_per_s(c) for c in counts}, generate_repeats)
    nbytes, per = WeightStream(model).nbytes, {}
    for c in counts:
        med = {k: statistics.median(v) for k, v in times[c].items()}
        per[c] = {"read_ms": med["read"], "read_gb_per_s": nbytes / med["read"] / 1e6, "ms": {n: med[n] for n in ROWS},
                  "decode_over_floor": med[1] / med["read"], "character_ms": med["character"],
                  "step_speedup": paired(times[1][1], times[c][1]),
                  "generate_tokens_per_s": statistics.median(x["tokens_per_s"] for x in gen[c]),
                  "generate_speedup": paired_rates(gen[1], gen[c]),
                  "same_text": all(x["text"] == gen[1][0]["text"] for x in gen[c])}
    return per


def step_breakdown(model, tokens, context: int, repeats: int = 9) -> dict:
    """Where a decode step's time goes beyond reading the weights (the fastest of turns, no profiler)."""
    cfg = model.cfg
    layers, nq, nkv, hd = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rows = forward_after(model, tokens, context)
    rng = np.random.default_rng(0)
    products = [(w, rng.standard_normal((1, w.shape[0])).astype(np.float32)) for w in weights_of(model)]
    head, x_head = products[-1]

    def all_products():
        for w, x in products:
            model.dot(x, w)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, kv, x, y = f32(1, nq, hd), f32(2, nkv, context + 1, hd), f32(cfg.hidden_size), f32(cfg.hidden_size)
    gate_up, rotation = f32(2 * cfg.intermediate_size), model.rotation[context]
    pairs = f32((nq + nkv) * hd).view(np.complex64).reshape(nq + nkv, hd // 2)      # |rotation| = 1

    def times(n, fn):
        return lambda: [fn() for _ in range(n)]

    table_of = {}

    def looked_up(x, w):      # a product answered from a table: the step without its matrix products
        if id(w) not in table_of:
            table_of[id(w)] = model.dot(x, w)
        return table_of[id(w)].copy()

    without = copy.copy(model)                         # the same model, its products looked up
    without.dot = looked_up
    rows(1, through=without)                           # fills the table
    parts = {"step": lambda: rows(1), "products": all_products, "without": lambda: rows(1, through=without),
             "lm_head": lambda: model.dot(x_head, head), "floor": WeightStream(model).read,
             "attention": times(layers, lambda: attention(q, kv[0], kv[1], context)),
             "rms_norm": times(2 * layers + 1, lambda: rms_norm_vector(x, model.c_eps)),
             "swiglu": times(layers, lambda: swiglu(gate_up[:cfg.intermediate_size], gate_up[cfg.intermediate_size:])),
             "rope": times(layers, lambda: np.multiply(pairs, rotation, out=pairs)),
             "residual": times(2 * layers, lambda: np.add(y, x, out=y))}
    measured = take_turns({k: timer(fn) for k, fn in parts.items()}, repeats, abba=False)
    return {k: min(pooled(v)) for k, v in measured.items()}


OPERATIONS = {"attention": "attention over the cached positions (scores, softmax, values), every layer",
              "rms_norm": "RMSNorm, 2 a layer + 1", "swiglu": "SwiGLU, 1 a layer", "rope": "RoPE, 1 a layer",
              "residual": "residual adds, 2 a layer"}


def run_smollm2(quick: bool = False, cache=None, max_threads: int = 2) -> dict:
    if not is_fetched(NAME, cache):
        raise SystemExit(f"bench smollm2: {NAME} is not in the cache {cache or cache_dir()}; "
                         f"run `decoding-playground fetch-model {NAME}` first")
    request_threads(1)          # one thread but where the threads part sets a count
    registry = ModelRegistry(fetched_models(cache))
    t = time.perf_counter()
    lm = registry.get(NAME)
    load_s, chosen, tok = time.perf_counter() - t, lm.model, lm.tokenizer
    tokens = np.array(tok.encode(tok.chat_template.prompt(SUMMARY_PROMPT + " " + SUMMARY_PROMPT)))
    models = {chosen.layout: chosen}                 # and, unless quick, the same weights in the other layout
    if not quick:
        cfg, weights, _ = load_checkpoint(lm.path, with_tokenizer=False)
        other = next(name for name in LAYOUTS if name != chosen.layout)
        models[other] = use_layout(Model(cfg, weights), other)
    times = step_costs(models, tokens, 3 if quick else 9)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor_how = min((k[1] for k in med if k[0] == "floor"), key=lambda h: med["floor", h])
    floor, one, nbytes = med["floor", floor_how], med[chosen.layout, 1], WeightStream(chosen).nbytes
    r = {"model": NAME, "load_s": load_s, "quick": quick, "layout": chosen.layout,
         "layout_choice_ms": chosen.layout_ms, "padded_rows": PanelWeight.padded_rows,
         "row_by_row": sorted(PanelWeight.row_by_row), "weight_bytes": nbytes,
         "times": {f"{a} {b}": v for (a, b), v in times.items()}, "floor_how": floor_how,
         "decode_tokens_per_s": 1e3 / one, "decode_over_floor": one / floor,
         "breakdown": step_breakdown(chosen, tokens, CONTEXT, 3 if quick else 9)}
    engine = InferenceEngine(registry, max_sessions=2)           # `ngram` against plain decoding, as bench heads runs them
    r["ngram"] = {label: against_plain(engine, [prompt], 96, 1 if quick else 3, [("ngram", NGRAM)])[None]
                  for label, prompt in (("summarise a paragraph", SUMMARY_PROMPT), ("open question", QUESTION_PROMPT))}
    summary = r["ngram"]["summarise a paragraph"]["rows"][0]
    r["ngram_summary_speedup"] = summary["measured"] if summary["identical"] else 0.0
    if max_threads > 1:
        r["threads"] = run_threads(chosen, tokens, list(range(1, max_threads + 1)), 3 if quick else 9, 1 if quick else 5)
        if 2 in r["threads"]:
            two = r["threads"][2]
            r["threads_decode_speedup"] = two["generate_speedup"]["median"]
            r["threads_decode_over_floor"] = 1e3 / two["generate_tokens_per_s"] / two["read_ms"]
    return r


def tables(r: dict) -> list[str]:
    times = {tuple(k.split(" ")): v for k, v in r["times"].items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = r["weight_bytes"] / 1e6
    passes = {"read": "floor: a BLAS dot of each stored array with itself", "gemv": "floor: one `W @ x` per matrix "
              "stored [out, in]", "1": f"decode step, context {CONTEXT} ({r['layout']})"}
    floor = table(["pass", "median ms", "GB/s"],
                  [[passes[b], med[a, b], mb / med[a, b]] for a, b in med
                   if a == "floor" or (a == r["layout"] and b == "1")],
                  f"The floor beside the step: {mb:.0f} MB of float32 weights, loaded in {r['load_s']:.1f} s in the "
                  "layout measured faster at load (one row + six through the LM head: " + ", ".join(
                      f"{k} {v:.1f} ms" for k, v in r["layout_choice_ms"].items()) + "); few-row products padded: "
                  + (", ".join(f"{n} as {p}" for n, p in sorted(r["padded_rows"].items())) or "none")
                  + "; row by row (a GEMV a row, a panel at a time): "
                  + (", ".join(f"{n} rows" for n in r.get("row_by_row", [])) or "none"))
    names = list(dict.fromkeys(a for a, _ in med if a != "floor"))
    curve = table(["layout", *(f"n={n}" for n in ROWS), "prefill tok/s"],
                  [[LAYOUT_LABELS[a] + (" (used)" if a == r["layout"] else ""),
                    *(f"{med[a, str(n)]:.1f} ({med[a, str(n)] / med[a, '1']:.2f}x)" for n in ROWS),
                    f"{CONTEXT * 1e3 / med[a, 'prefill']:.0f}"] for a in names],
                  f"Verification cost curve: ms of a forward over n rows at context {CONTEXT}, and t(n)/t(1)")
    ngram = table(["prompt", "plain decoding ms a forward", "decode speed-up", "mean acceptance length",
                   "t(verify)/t(1)", "identical output"],
                  [[label, d["t1_ms"], shown(x["decode_speedup"]), x["mean_acceptance_length"], x["v"], x["identical"]]
                   for label, d in r["ngram"].items() for x in d["rows"]],
                  f"`ngram` lookup (γ {NGRAM['num_speculative_tokens']}, n-gram {NGRAM['prompt_lookup_min']}.."
                  f"{NGRAM['prompt_lookup_max']}) against plain decoding, chat, greedy, 96 tokens")
    b = r["breakdown"]
    parts = [["the whole step", b["step"]], ["its matrix products (every weight's one-row product)", b["products"]],
             ["of which the LM head", b["lm_head"]], ["the floor: one bare pass over the weight bytes", b["floor"]],
             ["everything else: the step with its products looked up in a table", b["without"]],
             *([f"- {label}", b[k]] for k, label in OPERATIONS.items()),
             ["- the rest: Python lines, reshapes, K/V writes, cache bookkeeping, the table's copies",
              b["without"] - sum(b[k] for k in OPERATIONS)]]
    breakdown = table(["part", "ms", "share of the step"],
                      [[what, f"{v:.2f}", f"{v / b['step']:.1%}"] for what, v in parts], "Where a decode step's time goes (fastest of the turns)")
    out = [goals([(what, r[k], op, bound) for k, (what, op, bound) in GOALS.items() if k in r]), floor, curve,
           breakdown, ngram]
    if "threads" in r:
        per = r["threads"]
        out.append(table(["threads", "floor ms (GB/s)", "decode ms", "decode / floor", "decode speed-up",
                          "`generate` tok/s", "`generate` speed-up", "same text", "character model's step ms"],
                         [[c, f"{d['read_ms']:.1f} ({d['read_gb_per_s']:.1f})", d["ms"][1], d["decode_over_floor"],
                           shown(d["step_speedup"]), d["generate_tokens_per_s"], shown(d["generate_speedup"]),
                           d["same_text"], f"{d['character_ms']:.3f}"] for c, d in per.items()],
                         "Threads: in one process, then fresh `generate --threads T` processes"))
        out.append(table(["threads", *(f"n={n}" for n in ROWS)],
                         [[c, *(f"{d['ms'][n]:.1f} ({d['ms'][n] / d['ms'][1]:.2f}x)" for n in ROWS)]
                          for c, d in per.items()], "Verification cost curve per thread count, ms (t(n)/t(1))"))
    return out


def add_parser(bsub) -> None:
    b = add_bench(bsub, "smollm2", "SmolLM2-135M: floor, decode, prefill, verification curve, ngram, threads",
                  lambda args: run_smollm2(args.quick, args.cache_dir, args.threads), tables,
                  quick="fewer repeats, no other layout")
    b.add_argument("--cache-dir", default=None, help="the fetch-model cache (default: $DECODING_PLAYGROUND_CACHE)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="also measure 1 .. N threads for the weight products (default 2; 1: leave it out)")
