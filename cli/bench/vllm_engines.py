"""`bench engines`' vLLM part: our numpy engine against vLLM (CPU build, float32) on the same SmolLM2 weights.

Both as a user sees them: ours a fresh `decoding-playground generate --json` process per run with
OPENBLAS_NUM_THREADS set to the thread count (a process's BLAS threads are fixed when numpy loads), vLLM a
chat request to a server started for the thread count (VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS). Decode
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
import subprocess
import sys

from engine.external.openai_stream import stream_chat
from engine.external.vllm_server import NGRAM, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir

NAME = "smollm2-135m"
NGRAM_SETTINGS = {"method": "ngram", "num_speculative_tokens": NGRAM["num_speculative_tokens"],
                  "prompt_lookup_min": NGRAM["prompt_lookup_min"], "prompt_lookup_max": NGRAM["prompt_lookup_max"]}


def ours_generate(prompt: str, max_tokens: int, threads: int, ngram: bool = False) -> dict:
    """A fresh `generate --json` process (chat, greedy): its decode tokens/s and tokens."""
    spec = NGRAM_SETTINGS if ngram else {"method": "none"}
    args = [sys.executable, "-m", "cli.main", "generate", "--json", "--model", NAME, "--chat", "true",
            "--max-tokens", str(max_tokens), "--temperature", "0", "--enable-prefix-caching", "false"]
    for key, value in spec.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    done = subprocess.run(args + ["--prompt", prompt], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"generate failed: {done.stderr[-500:]}")
    s = json.loads(done.stdout)
    return {"tokens": s["num_output_tokens"], "tokens_per_s": 1.0 / s["tpot_s"]}


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
    """Ours against vLLM at 1 and 2 threads, and both n-gram speed-ups at 1 thread; medians of `repeats`."""
    reason = unavailable_reason(default_venv(cache_dir()), model_dir(NAME))
    if reason:
        return {"skipped": reason}
    out: dict = {"threads": {}, "ngram": {}}
    plain, ngram = servers(1, ("plain", "ngram"))
    try:
        runs: dict[str, list] = {k: [] for k in ("ours", "vllm", "ours plain", "ours n-gram", "vllm plain",
                                                 "vllm n-gram")}
        vllm_chat(plain, prompt, 8), vllm_chat(ngram, copy_prompt, 8)       # warm-up: first-call costs
        for _ in range(repeats):
            runs["ours"].append(ours_generate(prompt, max_tokens, 1))
            runs["vllm"].append(vllm_chat(plain, prompt, max_tokens))
            runs["ours plain"].append(ours_generate(copy_prompt, max_tokens, 1))
            runs["ours n-gram"].append(ours_generate(copy_prompt, max_tokens, 1, ngram=True))
            runs["vllm plain"].append(vllm_chat(plain, copy_prompt, max_tokens))
            runs["vllm n-gram"].append(vllm_chat(ngram, copy_prompt, max_tokens))
        out["threads"][1] = {"ours": median(runs["ours"]), "vllm": median(runs["vllm"])}
        out["ngram"] = {k: median(runs[k]) for k in ("ours plain", "ours n-gram", "vllm plain", "vllm n-gram")}
        out["ngram"]["vllm mean acceptance length"] = median(runs["vllm n-gram"], "mean_acceptance_length")
    finally:
        plain.stop()
        ngram.stop()
    (two,) = servers(2)
    try:
        ours2, vllm2 = [], []
        vllm_chat(two, prompt, 8)
        for _ in range(repeats):
            ours2.append(ours_generate(prompt, max_tokens, 2))
            vllm2.append(vllm_chat(two, prompt, max_tokens))
        out["threads"][2] = {"ours": median(ours2), "vllm": median(vllm2)}
    finally:
        two.stop()
    return out


def markdown(r: dict) -> list[str]:
    if "skipped" in r:
        return ["", f"vLLM: not measured ({r['skipped']})."]
    lines = ["", "Ours against vLLM (vllm-cpu 0.32.0, float32, torch.compile, the same SmolLM2 weights), decode tokens/s "
                 "(medians; ours a fresh `generate` per run):", "",
             "| threads | ours | vLLM (torch.compile) | ours / vLLM |", "|---|---|---|---|"]
    for t, d in sorted(r["threads"].items()):
        lines.append(f"| {t} | {d['ours']:.1f} | {d['vllm']:.1f} | {d['ours'] / d['vllm']:.2f}x |")
    n = r["ngram"]
    lines += ["", f"n-gram speculation ({NGRAM['prompt_lookup_min']}-{NGRAM['prompt_lookup_max']}-gram lookup, "
                  f"{NGRAM['num_speculative_tokens']} draft tokens, the same rule in both) on the copy prompt, "
                  "1 thread:", "", "| engine | plain | n-gram | speedup |", "|---|---|---|---|",
              f"| ours | {n['ours plain']:.1f} | {n['ours n-gram']:.1f} | {n['ours n-gram'] / n['ours plain']:.2f}x |",
              f"| vLLM | {n['vllm plain']:.1f} | {n['vllm n-gram']:.1f} | {n['vllm n-gram'] / n['vllm plain']:.2f}x |",
              "", f"vLLM's mean acceptance length there: {n['vllm mean acceptance length']:.2f}."]
    return lines
