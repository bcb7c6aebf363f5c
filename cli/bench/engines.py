"""`decoding-playground bench engines`: our numpy engine against llama.cpp and vLLM on the same SmolLM2-135M
weights (vLLM's part: cli/bench/vllm_engines.py).

A decode step reads every weight once; at batch 1 it is memory-bound, so the tokens per second of two
engines should be close to the inverse ratio of the bytes their weights take: float32 here (our engine
dequantizes the GGUF), Q4_1 in llama.cpp. Measured as a user sees it: a fresh chat generation each time,
greedy, the same prompt and number of tokens, one thread each (OPENBLAS_NUM_THREADS=1 and llama.cpp's
`n_threads` 1), the engines alternated in one run so that a shared machine's noise hits both alike.
Decode speed is 1 / (time between the first and the last token) per token: our engine's own clock for ours,
the arrival of the chunks for llama.cpp (its own clock beside it). The machine's streaming bandwidth is one
thread's BLAS dot of a 256 MB array with itself, for the GB/s each engine achieves.
"""
from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import time

import numpy as np

from cli.bench import engine_threads
from engine.external.llamacpp_server import NGRAM, EmbeddedLlamaCpp, gguf_path, unavailable_reason
from cli.bench.vllm_engines import chat_summary, run_vllm
from cli.bench.vllm_engines import markdown as vllm_markdown
from engine.model.fetched import fetched_models, is_fetched
from engine.model.thread_choice import request_threads
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

NAME = "smollm2-135m"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
MAX_TOKENS = 64
# where speculation by n-gram lookup can pay: an answer that copies its prompt
COPY_PROMPT = ("Repeat this list exactly, one item a line: apples, bread, butter, cheese, eggs, flour, "
               "honey, milk, oats, pasta, rice, salt, sugar, tea, tomatoes, yoghurt.")


def streaming_bandwidth(repeats: int = 5) -> float:
    """Bytes per second one thread reads: a BLAS dot of a 256 MB float32 array with itself, as engine/model/layout.py's
    floor reads the weights (median of `repeats`; numpy's own sum reads at about half that speed)."""
    a = np.ones(64 * 1024 * 1024, dtype=np.float32)
    np.dot(a, a)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.dot(a, a)
        times.append(time.perf_counter() - t)
    return a.nbytes / statistics.median(times)


def ours(engine: InferenceEngine, max_tokens: int, prompt: str = PROMPT, ngram: bool = False) -> dict:
    speculation = ({"method": "ngram", "num_speculative_tokens": NGRAM[1], "prompt_lookup_min": NGRAM[0],
                    "prompt_lookup_max": NGRAM[0]} if ngram else {"method": "none"})
    session = GenerationSession(engine, prompt, {"model": NAME, "chat": True, "max_tokens": max_tokens,
                                                  "temperature": 0.0, "enable_prefix_caching": False,
                                                  **speculation})
    done = None
    for event in session.events():
        if event.type == "done":
            done = event.summary
        elif event.type == "error":
            raise RuntimeError(event.message)
    return {"tokens": done["num_output_tokens"], "tokens_per_s": 1.0 / done["tpot_s"], "ttft_ms": done["ttft_ms"]}


def llamacpp(server: EmbeddedLlamaCpp, max_tokens: int, prompt: str = PROMPT) -> dict:
    s = chat_summary(server.engine, prompt, max_tokens)
    n = s["engine_usage"].get("completion_tokens") or s["num_output_tokens"]
    return {"tokens": n, "tokens_per_s": 1e3 / s["itl_ms"], "ttft_ms": s["ttft_ms"],
            "engine_tokens_per_s": s["engine_tokens_per_s"]}


def run_engines(repeats: int, max_tokens: int = MAX_TOKENS, threads: int = 2, llamacpp_threads: int = 1,
                with_transformers: bool = True, with_vllm: bool = True) -> dict:
    if not is_fetched(NAME):
        raise SystemExit(f"bench engines: {NAME} is not fetched; run `decoding-playground fetch-model {NAME}`")
    reason = unavailable_reason(gguf_path())
    if reason:
        raise SystemExit(f"bench engines: llama.cpp cannot run: {reason}")
    request_threads(1)          # this part: ours on one thread; engine_threads races 1 .. N
    registry = ModelRegistry(fetched_models())
    engine = InferenceEngine(registry, max_sessions=1)
    lm = registry.get(NAME)
    server = EmbeddedLlamaCpp.start(gguf_path(), threads=llamacpp_threads, parallel=1)
    ngram_server = EmbeddedLlamaCpp.start(gguf_path(), threads=llamacpp_threads, parallel=1, ngram=NGRAM)
    results: dict[str, list] = {"ours": [], "llamacpp": []}
    speculation: dict[str, list] = {"ours plain": [], "ours n-gram": [], "llama.cpp plain": [],
                                    "llama.cpp n-gram": []}
    try:
        ours(engine, 8), llamacpp(server, 8), llamacpp(ngram_server, 8)    # warm-up: first-call costs
        for _ in range(repeats):
            results["ours"].append(ours(engine, max_tokens))
            results["llamacpp"].append(llamacpp(server, max_tokens))
            speculation["ours plain"].append(ours(engine, max_tokens, COPY_PROMPT))
            speculation["ours n-gram"].append(ours(engine, max_tokens, COPY_PROMPT, ngram=True))
            speculation["llama.cpp plain"].append(llamacpp(server, max_tokens, COPY_PROMPT))
            speculation["llama.cpp n-gram"].append(llamacpp(ngram_server, max_tokens, COPY_PROMPT))
        bandwidth = streaming_bandwidth()
    finally:
        server.close()
        ngram_server.close()
    bytes_per_token = {"ours": lm.model.num_parameters * 4, "llamacpp": gguf_path().stat().st_size}
    r = {"date": dt.date.today().isoformat(), "repeats": repeats, "max_tokens": max_tokens, "threads": 1,
         "llamacpp_threads": llamacpp_threads,
         "bandwidth_bytes_per_s": bandwidth, "engines": {}}
    for name, runs in results.items():
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        r["engines"][name] = {"tokens_per_s": tps, "ms_per_token": 1e3 / tps,
                              "bytes_per_token": bytes_per_token[name],
                              "bytes_per_s": tps * bytes_per_token[name],
                              "ttft_ms": statistics.median(x["ttft_ms"] for x in runs),
                              "tokens": [x["tokens"] for x in runs], "runs_tokens_per_s": [x["tokens_per_s"] for x in runs]}
    r["engines"]["llamacpp"]["engine_tokens_per_s"] = statistics.median(
        x["engine_tokens_per_s"] for x in results["llamacpp"])
    r["speculation"] = {name: statistics.median(x["tokens_per_s"] for x in runs) for name, runs in speculation.items()}
    e = r["engines"]
    r["predicted_ratio"] = e["ours"]["bytes_per_token"] / e["llamacpp"]["bytes_per_token"]
    r["measured_ratio"] = e["llamacpp"]["tokens_per_s"] / e["ours"]["tokens_per_s"]
    if threads > 1:
        r["at_threads"] = engine_threads.run_threads(range(1, threads + 1), repeats, PROMPT, max_tokens, lm,
                                                     llamacpp, with_transformers)
    if with_vllm:
        r["vllm"] = run_vllm(repeats, PROMPT, COPY_PROMPT, max_tokens)
    return r


def markdown(r: dict) -> str:
    bw = r["bandwidth_bytes_per_s"]
    lines = [f"Measured {r['date']}: SmolLM2-135M-Instruct, chat, greedy, {r['max_tokens']} new tokens, "
             f"{r['threads']} thread each, medians of {r['repeats']} alternated runs (decode: 1 / time per token "
             f"after the first). Machine streaming bandwidth (one thread, a BLAS dot of 256 MB with itself): "
             f"{bw / 1e9:.1f} GB/s.", "",
             "| engine | weights | tokens/s | ms/token | bytes/token | GB/s achieved | share of streaming bandwidth |",
             "|---|---|---|---|---|---|---|"]
    for name, label, weights in (("ours", "ours (numpy)", "float32"), ("llamacpp", "llama.cpp (xllamacpp)", "Q4_1")):
        d = r["engines"][name]
        lines.append(f"| {label} | {weights} | {d['tokens_per_s']:.1f} | {d['ms_per_token']:.1f} | "
                     f"{d['bytes_per_token'] / 1e6:.0f} MB | {d['bytes_per_s'] / 1e9:.2f} | {d['bytes_per_s'] / bw:.0%} |")
    lines += ["", f"Bytes predict llama.cpp {r['predicted_ratio']:.1f}x faster; measured "
                  f"{r['measured_ratio']:.1f}x. llama.cpp's own clock: "
                  f"{r['engines']['llamacpp']['engine_tokens_per_s']:.1f} tokens/s.", "",
              f"Plain decoding against n-gram speculation ({NGRAM[0]}-gram lookup, up to {NGRAM[1]} draft tokens, "
              "ours and llama.cpp's ngram_simple) on a prompt whose answer copies it, tokens/s (medians):", "",
              "| engine | plain | n-gram | speedup |", "|---|---|---|---|"]
    sp = r["speculation"]
    for name in ("ours", "llama.cpp"):
        plain, ngram = sp[f"{name} plain"], sp[f"{name} n-gram"]
        lines.append(f"| {name} | {plain:.1f} | {ngram:.1f} | {ngram / plain:.2f}x |")
    if "at_threads" in r:
        lines += engine_threads.markdown(r["at_threads"])
    if "vllm" in r:
        lines += vllm_markdown(r["vllm"])
    return "\n".join(lines)


def cmd_bench_engines(args) -> int:
    r = run_engines(args.repeats, threads=args.threads, llamacpp_threads=args.llamacpp_threads,
                    with_transformers=not args.no_transformers, with_vllm=not args.no_vllm)
    print(json.dumps(r, indent=2) if args.json else markdown(r))
    if not args.no_write:
        from cli.bench.engine import DOCS, write_section
        write_section("engines", markdown(r))
        print(f"\n(written to {DOCS})", file=sys.stderr)
    return 0


def add_parser(bsub) -> None:
    b = bsub.add_parser("engines", help="our numpy engine against llama.cpp on SmolLM2: tokens/s, bytes/token, GB/s")
    b.add_argument("--repeats", type=int, default=5, help="alternated runs of each engine (default 5)")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    b.add_argument("--no-vllm", action="store_true", help="leave vLLM out (it starts vLLM servers of about 3.6 GB each)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="also race every engine at 1 .. N threads, interleaved (default 2; 1: leave it out)")
    b.add_argument("--llamacpp-threads", type=int, default=1, metavar="N",
                   help="llama.cpp's threads in the one-thread comparison and the n-gram part (default 1)")
    b.add_argument("--no-transformers", action="store_true",
                   help="leave Hugging Face transformers out of the thread race (it needs `make transformers`)")
    b.set_defaults(func=cmd_bench_engines)
