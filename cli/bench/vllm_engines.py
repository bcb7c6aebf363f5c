"""`bench engines`' vLLM part: our numpy engine against vLLM's CPU build (float32, torch.compile: its start-up is not
measured) on the same SmolLM2 weights, at 1 and 2 threads, and both engines' n-gram speculation with the same rule.

Ours as everywhere in `bench engines`: fresh `generate --threads T` processes; vLLM a chat request to a server
started for the thread count (VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS), warmed up with a generation first.
Decode speed is 1 / time per token after the first: our summary's TPOT, vLLM's chunk arrivals.
"""
from __future__ import annotations

import asyncio
import statistics

from cli.bench.lib import paired_rates, shown, table, take_turns
from cli.bench.smollm2 import NAME, generate_tokens_per_s
from engine.external.openai_stream import stream_chat
from engine.external.vllm_server import NGRAM, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir


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
    return {"tokens_per_s": 1e3 / s["itl_ms"], "mean_acceptance_length": s.get("mean_acceptance_length")}


def servers(threads: int, variants=("plain",)) -> list[VllmServer]:
    cache = cache_dir()
    made = [VllmServer(VARIANTS[v], default_venv(cache), model_dir(NAME, cache), cache / "vllm", threads,
                       eager=False) for v in variants]
    for s in made:
        s.start()

    async def all_ready():
        return await asyncio.gather(*(s.wait_ready() for s in made))
    if not all(asyncio.run(all_ready())):
        for s in made:
            s.stop()
        raise SystemExit(f"bench engines: vLLM did not start: {[s.error for s in made if s.error]}")
    return made


def run_vllm(repeats: int, prompt: str, copy_prompt: str, max_tokens: int) -> dict:
    """Ours against vLLM at 1 and 2 threads, and both n-gram speed-ups at 1 thread, taking turns."""
    reason = unavailable_reason(default_venv(cache_dir()), model_dir(NAME))
    if reason:
        return {"skipped": reason}
    runs = {}
    for threads in (1, 2):
        made = servers(threads, ("plain", "ngram") if threads == 1 else ("plain",))
        try:
            for s, p in zip(made, (prompt, copy_prompt)):
                vllm_chat(s, p, 8)                                      # warm-up: first-call costs
            sides = {("ours", threads): lambda t=threads: generate_tokens_per_s(t, prompt, max_tokens),
                     ("vllm", threads): lambda: vllm_chat(made[0], prompt, max_tokens)}
            if threads == 1:
                sides.update({("ours", "plain"): lambda: generate_tokens_per_s(1, copy_prompt, max_tokens),
                              ("ours", "n-gram"): lambda: generate_tokens_per_s(1, copy_prompt, max_tokens, **NGRAM),
                              ("vllm", "plain"): lambda: vllm_chat(made[0], copy_prompt, max_tokens),
                              ("vllm", "n-gram"): lambda: vllm_chat(made[1], copy_prompt, max_tokens)})
            runs.update(take_turns(sides, repeats))
        finally:
            for s in made:
                s.stop()
    tps = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
    return {"tokens_per_s": {f"{e} {k}": v for (e, k), v in tps.items()},
            "ngram_speedup": {e: paired_rates(runs[e, "plain"], runs[e, "n-gram"]) for e in ("ours", "vllm")},
            "vllm_mean_acceptance_length": statistics.median(x["mean_acceptance_length"] for x in runs["vllm", "n-gram"])}


def tables(r: dict) -> list[str]:
    if "skipped" in r:
        return [table(["vLLM"], [[f"not measured: {r['skipped']}"]])]
    tps = r["tokens_per_s"]
    return [table(["threads", "ours", "vLLM (torch.compile)", "ours / vLLM"],
                  [[t, tps[f"ours {t}"], tps[f"vllm {t}"], f"{tps[f'ours {t}'] / tps[f'vllm {t}']:.2f}x"] for t in (1, 2)],
                  "Ours against vLLM (vllm-cpu, float32), decode tokens/s"),
            table(["engine", "plain", "n-gram", "speed-up", "mean acceptance length"],
                  [[e, tps[f"{e} plain"], tps[f"{e} n-gram"], shown(r["ngram_speedup"][e]),
                    r["vllm_mean_acceptance_length"] if e == "vllm" else None] for e in ("ours", "vllm")],
                  f"n-gram speculation ({NGRAM['prompt_lookup_min']}-{NGRAM['prompt_lookup_max']}-gram lookup, "
                  f"{NGRAM['num_speculative_tokens']} draft tokens, the same rule in both) on the copy prompt, 1 thread")]
