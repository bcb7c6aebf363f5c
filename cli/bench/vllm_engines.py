"""`bench engines`' vLLM part: our numpy engine against vLLM (CPU build, float32) on the same SmolLM2 weights.

Both as a served engine runs, warm: ours in a worker process per thread count (`--threads`: the weight
products' threads, engine/model/threads.py; BLAS stays at one), one fresh session per generation as the page
starts one, vLLM a chat request to a server started for the thread count (VLLM_CPU_OMP_THREADS_BIND,
OMP_NUM_THREADS); each side warmed up with a generation first. Decode
speed is 1 / time per token after the first: our summary's TPOT, vLLM's chunk arrivals (its inter-token
latency). The runs alternate within one thread count, so that a shared machine's noise hits both alike; at
one thread the n-gram speed-ups (plain against n-gram with the same lookup sizes and γ, on a prompt whose
answer copies it) are measured in the same alternation.
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys

from cli.bench.lib import JsonWorker, generation, paired_rates, shown, table, take_turns
from engine.external.openai_stream import stream_chat
from engine.external.vllm_server import NGRAM, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir

NAME = "smollm2-135m"
NGRAM_SETTINGS = {"method": "ngram", "num_speculative_tokens": NGRAM["num_speculative_tokens"],
                  "prompt_lookup_min": NGRAM["prompt_lookup_min"], "prompt_lookup_max": NGRAM["prompt_lookup_max"]}


def ours(threads: int) -> JsonWorker:
    """Our engine in a process of its own on `threads` weight-product threads, SmolLM2 loaded once (`worker`)."""
    return JsonWorker([sys.executable, "-m", "cli.bench.vllm_engines", str(threads)],
                      {**os.environ, "OPENBLAS_NUM_THREADS": "1"})


def worker(threads: int) -> None:
    """The worker's loop: a JSON request a line in, the generation's figures a line out."""
    from engine.model.fetched import fetched_models
    from engine.model.thread_choice import request_threads
    from engine.serving.registry import InferenceEngine, ModelRegistry
    request_threads(threads)
    engine = InferenceEngine(ModelRegistry(fetched_models()), max_sessions=1)
    for line in sys.stdin:
        r = json.loads(line)
        settings = {"model": NAME, "chat": True, "max_tokens": r["max_tokens"], "temperature": 0.0,
                    "enable_prefix_caching": False, **(NGRAM_SETTINGS if r["ngram"] else {"method": "none"})}
        summary = generation(engine, r["prompt"], settings)[1]
        print(json.dumps({"tokens_per_s": 1.0 / summary["tpot_s"]}), flush=True)


def ask(worker_: JsonWorker, prompt: str, max_tokens: int, ngram: bool = False) -> dict:
    return worker_.ask({"prompt": prompt, "max_tokens": max_tokens, "ngram": ngram})


def chat_summary(engine, prompt: str, max_tokens: int) -> dict:
    """A greedy chat generation on a server (llama.cpp's, vLLM's): its summary."""
    async def run():
        return [e async for e in stream_chat(engine, prompt, {"max_tokens": max_tokens, "temperature": 0.0})]
    events = asyncio.run(run())
    if events[-1].type != "done":
        raise RuntimeError(events[-1].message)
    return events[-1].summary


def vllm_chat(server: VllmServer, prompt: str, max_tokens: int) -> dict:
    s = chat_summary(server.engine, prompt, max_tokens)
    return {"tokens": s["num_output_tokens"], "tokens_per_s": 1e3 / s["itl_ms"],
            "mean_acceptance_length": s.get("mean_acceptance_length")}


def servers(threads: int, variants=("plain",)) -> list[VllmServer]:
    """vLLM at its fastest here: torch.compile (its start-up is not measured)."""
    cache = cache_dir()
    made = [VllmServer(VARIANTS[v], default_venv(cache), model_dir(NAME, cache), cache / "vllm", threads,
                       eager=False) for v in variants]
    for s in made:
        s.start()

    async def all_ready():
        return await asyncio.gather(*(s.wait_ready() for s in made))
    ready = asyncio.run(all_ready())
    if not all(ready):
        for s in made:
            s.stop()
        raise SystemExit(f"bench engines: vLLM did not start: {[s.error for s in made if s.error]}")
    return made


def median(runs: list[dict], key: str = "tokens_per_s") -> float:
    return statistics.median(r[key] for r in runs)


def run_vllm(repeats: int, prompt: str, copy_prompt: str, max_tokens: int) -> dict:
    """Ours against vLLM at 1 and 2 threads, and both n-gram speed-ups at 1 thread, taking turns; medians."""
    reason = unavailable_reason(default_venv(cache_dir()), model_dir(NAME))
    if reason:
        return {"skipped": reason}
    out: dict = {"threads": {}}
    plain, ngram = servers(1, ("plain", "ngram"))
    mine = ours(1)
    try:
        vllm_chat(plain, prompt, 8), vllm_chat(ngram, copy_prompt, 8)       # warm-up: first-call costs
        ask(mine, prompt, 8), ask(mine, copy_prompt, 8, ngram=True)
        runs = take_turns({"ours": lambda: ask(mine, prompt, max_tokens), "vllm": lambda: vllm_chat(plain, prompt, max_tokens),
                           "ours plain": lambda: ask(mine, copy_prompt, max_tokens),
                           "ours n-gram": lambda: ask(mine, copy_prompt, max_tokens, ngram=True),
                           "vllm plain": lambda: vllm_chat(plain, copy_prompt, max_tokens),
                           "vllm n-gram": lambda: vllm_chat(ngram, copy_prompt, max_tokens)}, repeats)
        out["threads"][1] = {"ours": median(runs["ours"]), "vllm": median(runs["vllm"])}
        out["ngram"] = {k: median(runs[k]) for k in ("ours plain", "ours n-gram", "vllm plain", "vllm n-gram")}
        out["ngram_speedup"] = {e: paired_rates(runs[f"{e} plain"], runs[f"{e} n-gram"]) for e in ("ours", "vllm")}
        out["vllm_mean_acceptance_length"] = median(runs["vllm n-gram"], "mean_acceptance_length")
    finally:
        plain.stop()
        ngram.stop()
        mine.close()
    (two,) = servers(2)
    mine = ours(2)
    try:
        vllm_chat(two, prompt, 8), ask(mine, prompt, 8)
        runs = take_turns({"ours": lambda: ask(mine, prompt, max_tokens), "vllm": lambda: vllm_chat(two, prompt, max_tokens)},
                          repeats)
        out["threads"][2] = {k: median(v) for k, v in runs.items()}
    finally:
        two.stop()
        mine.close()
    return out


def tables(r: dict) -> list[str]:
    if "skipped" in r:
        return [table(["vLLM"], [[f"not measured: {r['skipped']}"]])]
    n = r["ngram"]
    return [table(["threads", "ours", "vLLM (torch.compile)", "ours / vLLM"],
                  [[t, d["ours"], d["vllm"], f"{d['ours'] / d['vllm']:.2f}x"] for t, d in sorted(r["threads"].items())],
                  "Ours against vLLM (vllm-cpu, float32), decode tokens/s, each warm, a fresh session per generation"),
            table(["engine", "plain", "n-gram", "speed-up", "mean acceptance length"],
                  [["ours", n["ours plain"], n["ours n-gram"], shown(r["ngram_speedup"]["ours"]), None],
                   ["vLLM", n["vllm plain"], n["vllm n-gram"], shown(r["ngram_speedup"]["vllm"]),
                    r["vllm_mean_acceptance_length"]]],
                  f"n-gram speculation ({NGRAM['prompt_lookup_min']}-{NGRAM['prompt_lookup_max']}-gram lookup, "
                  f"{NGRAM['num_speculative_tokens']} draft tokens, the same rule in both) on the copy prompt, 1 thread")]


if __name__ == "__main__":
    worker(int(sys.argv[1]))
