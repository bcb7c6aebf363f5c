"""`decoding-playground bench engines`: our numpy engine against llama.cpp, Hugging Face transformers and vLLM on the
same SmolLM2-135M weights (vLLM's part: cli/bench/vllm_engines.py).

A decode step at batch 1 reads every weight once, so two engines' tokens/s should be near the inverse ratio of
their weights' bytes: float32 here (our engine dequantizes the GGUF), Q4_1 in llama.cpp. Measured as a user sees
it: a fresh chat generation each time, greedy, the same prompt and tokens, the engines taking turns; decode speed
is 1 / time per token after the first, each engine's own way of seeing its tokens (ours: the summary's TPOT;
llama.cpp: chunk arrivals; transformers: a stamp per generated token). The streaming bandwidth is one thread's
BLAS dot of a 256 MB array with itself, as engine/model/layout.py's floor reads the weights. With --threads N:
ours (fresh `generate --threads T` processes), llama.cpp (a server per count) and transformers (a worker per count
in its own virtual environment, `make transformers`: torch is no project dependency; cli/bench/hf_worker.py) at
1 .. N threads.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path

import numpy as np

from cli.bench.lib import (JsonWorker, add_bench, generation, machine, paired_rates, shown, table, take_turns,
                           timer)
from cli.bench.smollm2 import GENERATE_PROMPT as PROMPT
from cli.bench.smollm2 import NAME, generate_tokens_per_s
from cli.bench.vllm_engines import chat_summary, run_vllm
from cli.bench.vllm_engines import tables as vllm_tables
from engine.external.llamacpp_server import NGRAM, EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.model.fetched import cache_dir, fetched_models, is_fetched, model_dir
from engine.model.thread_choice import request_threads
from engine.serving.registry import InferenceEngine, ModelRegistry

MAX_TOKENS = 64
# where speculation by n-gram lookup can pay: an answer that copies its prompt
COPY_PROMPT = ("Repeat this list exactly, one item a line: apples, bread, butter, cheese, eggs, flour, "
               "honey, milk, oats, pasta, rice, salt, sugar, tea, tomatoes, yoghurt.")
TRANSFORMERS_ENV = "DECODING_PLAYGROUND_TRANSFORMERS_VENV"
WORKER = Path(__file__).resolve().with_name("hf_worker.py")
LABELS = {"ours": "ours (numpy, float32)", "llama.cpp": "llama.cpp (xllamacpp, Q4_1)",
          "transformers": "transformers (torch, float32)"}


def streaming_bandwidth(repeats: int = 5) -> float:
    """Bytes per second one thread reads (median of `repeats`; numpy's own sum reads at about half that speed)."""
    a = np.ones(64 * 1024 * 1024, dtype=np.float32)
    return a.nbytes / statistics.median(timer(lambda: np.dot(a, a), repeats, warm=1)()) * 1e3


def ours(engine: InferenceEngine, max_tokens: int, prompt: str = PROMPT, ngram: bool = False) -> dict:
    speculation = ({"method": "ngram", "num_speculative_tokens": NGRAM[1], "prompt_lookup_min": NGRAM[0],
                    "prompt_lookup_max": NGRAM[0]} if ngram else {"method": "none"})
    _, done, _ = generation(engine, prompt, {"model": NAME, "chat": True, "max_tokens": max_tokens, "temperature": 0.0,
                                             "enable_prefix_caching": False, **speculation})
    return {"tokens_per_s": 1.0 / done["tpot_s"]}


def llamacpp(server: EmbeddedLlamaCpp, max_tokens: int, prompt: str = PROMPT) -> dict:
    s = chat_summary(server.engine, prompt, max_tokens)
    return {"tokens_per_s": 1e3 / s["itl_ms"], "engine_tokens_per_s": s["engine_tokens_per_s"]}


def transformers_worker(threads: int) -> JsonWorker:
    """cli/bench/hf_worker.py in the transformers environment (`make transformers`; $DECODING_PLAYGROUND_TRANSFORMERS_VENV
    overrides where), at a fixed thread count."""
    python = Path(os.environ.get(TRANSFORMERS_ENV) or cache_dir() / "transformers" / "venv") / "bin" / "python"
    if not python.is_file():
        raise FileNotFoundError(f"no transformers environment at {python.parent.parent} (make transformers)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    worker = JsonWorker([str(python), str(WORKER), str(model_dir(NAME)), str(threads)], env, quiet=True)
    worker.info = worker.read()
    return worker


def hf_generate(worker: JsonWorker, ids: list[int], max_tokens: int, eos: int | None) -> dict:
    r = worker.ask({"input_ids": ids, "max_new_tokens": max_tokens, "eos_token_id": eos})
    steps = r["step_s"]
    return {"tokens_per_s": len(steps) / sum(steps) if steps else None, "ids": r["ids"]}


def one_thread(engine, repeats: int, max_tokens: int, llamacpp_threads: int) -> dict:
    """Ours on one thread against llama.cpp, and both with n-gram speculation on the copy prompt, taking turns."""
    server = EmbeddedLlamaCpp.start(gguf_path(), threads=llamacpp_threads, parallel=1)
    ngram_server = EmbeddedLlamaCpp.start(gguf_path(), threads=llamacpp_threads, parallel=1, ngram=NGRAM)
    try:
        ours(engine, 8), llamacpp(server, 8), llamacpp(ngram_server, 8)    # warm-up: first-call costs
        return take_turns({"ours": lambda: ours(engine, max_tokens), "llama.cpp": lambda: llamacpp(server, max_tokens),
                           "ours plain": lambda: ours(engine, max_tokens, COPY_PROMPT),
                           "ours n-gram": lambda: ours(engine, max_tokens, COPY_PROMPT, ngram=True),
                           "llama.cpp plain": lambda: llamacpp(server, max_tokens, COPY_PROMPT),
                           "llama.cpp n-gram": lambda: llamacpp(ngram_server, max_tokens, COPY_PROMPT)}, repeats)
    finally:
        server.close()
        ngram_server.close()


def at_threads(counts, repeats: int, max_tokens: int, lm, with_transformers: bool) -> dict:
    """Decode tokens/s per engine and thread count (medians), every engine and count taking turns; what was left
    out and why."""
    skipped, servers, workers = {}, {}, {}
    reason = unavailable_reason(gguf_path())
    if reason:
        skipped["llama.cpp"] = reason
    tok, eos = lm.tokenizer, lm.cfg.eos_token_id
    ids = tok.encode(tok.chat_template.prompt(PROMPT))
    try:
        servers = {} if reason else {t: EmbeddedLlamaCpp.start(gguf_path(), threads=t, parallel=1) for t in counts}
        if with_transformers:
            try:
                workers = {t: transformers_worker(t) for t in counts}
            except (FileNotFoundError, RuntimeError) as e:
                skipped["transformers"] = str(e)
        sides = {("ours", t): lambda t=t: generate_tokens_per_s(t, PROMPT, max_tokens) for t in counts}
        for t, s in servers.items():
            llamacpp(s, 8)                                                  # warm-up: first-call costs
            sides["llama.cpp", t] = lambda s=s: llamacpp(s, max_tokens)
        for t, w in workers.items():
            hf_generate(w, ids, 8, eos)
            sides["transformers", t] = lambda w=w: hf_generate(w, ids, max_tokens, eos)
        runs = take_turns(sides, repeats)
    finally:
        for s in servers.values():
            s.close()
        for w in workers.values():
            w.close()
    tps: dict = {}
    for (engine, t), v in runs.items():
        tps.setdefault(engine, {})[t] = statistics.median(x["tokens_per_s"] for x in v)
    ours_text = runs["ours", counts[0]][0]["text"]
    same = {t: tok.decode(runs["transformers", t][0]["ids"]).replace("<|im_end|>", "") in ours_text
            for t in workers}
    info = next(iter(workers.values())).info if workers else None
    return {"counts": counts, "tokens_per_s": tps, "skipped": skipped, "transformers": info,
            "transformers_same_text": same}


def run_engines(args) -> dict:
    if not is_fetched(NAME):
        raise SystemExit(f"bench engines: {NAME} is not fetched; run `decoding-playground fetch-model {NAME}`")
    reason = unavailable_reason(gguf_path())
    if reason:
        raise SystemExit(f"bench engines: llama.cpp cannot run: {reason}")
    m = machine()
    request_threads(1)          # ours on one thread here; the thread race runs fresh processes per count
    registry = ModelRegistry(fetched_models())
    lm = registry.get(NAME)
    runs = one_thread(InferenceEngine(registry, max_sessions=1), args.repeats, MAX_TOKENS, args.llamacpp_threads)
    bandwidth = streaming_bandwidth()
    tps = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
    bytes_per_token = {"ours": lm.model.num_parameters * 4, "llama.cpp": gguf_path().stat().st_size}
    r = {"machine": m, "repeats": args.repeats, "max_tokens": MAX_TOKENS, "llamacpp_threads": args.llamacpp_threads,
         "bandwidth_bytes_per_s": bandwidth, "tokens_per_s": tps, "bytes_per_token": bytes_per_token,
         "llamacpp_own_tokens_per_s": statistics.median(x["engine_tokens_per_s"] for x in runs["llama.cpp"]),
         "ngram": {e: paired_rates(runs[f"{e} plain"], runs[f"{e} n-gram"]) for e in ("ours", "llama.cpp")}}
    if args.threads > 1:
        r["at_threads"] = at_threads(list(range(1, args.threads + 1)), args.repeats, MAX_TOKENS, lm,
                                     not args.no_transformers)
    if not args.no_vllm:
        r["vllm"] = run_vllm(args.repeats, PROMPT, COPY_PROMPT, MAX_TOKENS)
    return r


def tables(r: dict) -> list[str]:
    bw, tps, size = r["bandwidth_bytes_per_s"], r["tokens_per_s"], r["bytes_per_token"]
    out = [table(["engine", "threads", "tokens/s", "ms/token", "bytes/token", "GB/s achieved",
                  "share of streaming bandwidth", "tokens/s predicted by bytes"],
                 [[LABELS[e], 1 if e == "ours" else r["llamacpp_threads"], tps[e], 1e3 / tps[e], f"{size[e] / 1e6:.0f} MB",
                   tps[e] * size[e] / 1e9, f"{tps[e] * size[e] / bw:.0%}", tps["ours"] * size["ours"] / size[e]]
                  for e in ("ours", "llama.cpp")],
                 f"One thread each, streaming bandwidth {bw / 1e9:.1f} GB/s; llama.cpp's own clock "
                 f"{r['llamacpp_own_tokens_per_s']:.1f} tokens/s"),
           table(["engine", "plain tok/s", "n-gram tok/s", "speed-up"],
                 [[e, tps[f"{e} plain"], tps[f"{e} n-gram"], shown(r["ngram"][e])] for e in ("ours", "llama.cpp")],
                 f"n-gram speculation ({NGRAM[0]}-gram lookup, up to {NGRAM[1]} draft tokens) on a prompt whose "
                 "answer copies it")]
    if "at_threads" in r:
        a = r["at_threads"]
        counts, by = a["counts"], a["tokens_per_s"]
        top = counts[-1]
        rows = [[LABELS[e], *(v.get(t) for t in counts),
                 f"{by['ours'][top] / v[top]:.2f}x" if e != "ours" and top in v else ""] for e, v in by.items()]
        rows += [[f"{e}: not measured ({why})", *([None] * len(counts)), ""] for e, why in a["skipped"].items()]
        title = "Decode tokens/s at equal threads"
        if a["transformers"]:
            i = a["transformers"]
            same = ", ".join(f"{t}: {'yes' if v else 'no'}" for t, v in a["transformers_same_text"].items())
            title += f" (transformers {i['transformers']}, torch {i['torch']}; its text a prefix of ours: {same})"
        out.append(table(["engine", *(f"{t} thread{'s' * (t > 1)}" for t in counts), f"ours / it at {top}"], rows, title))
    return out + (vllm_tables(r["vllm"]) if "vllm" in r else [])


def add_parser(bsub) -> None:
    b = add_bench(bsub, "engines", "our numpy engine against llama.cpp, transformers and vLLM on SmolLM2", run_engines,
                  tables)
    b.add_argument("--repeats", type=int, default=5, help="turns of each engine (default 5)")
    b.add_argument("--no-vllm", action="store_true", help="leave vLLM out (it starts vLLM servers of about 3.6 GB each)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="also race every engine at 1 .. N threads, taking turns (default 2; 1: leave it out)")
    b.add_argument("--llamacpp-threads", type=int, default=1, metavar="N",
                   help="llama.cpp's threads in the one-thread comparison and the n-gram part (default 1)")
    b.add_argument("--no-transformers", action="store_true",
                   help="leave Hugging Face transformers out of the thread race (it needs `make transformers`)")
