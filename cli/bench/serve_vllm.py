"""`bench serve --engine vllm`: the second seed's concurrency sweep, vLLM against our engine, through one real
`decoding-playground serve --vllm` and its websockets, on the same SmolLM2 weights and prompts.

At 1, 4 and 16 concurrent sessions: aggregate output tokens/s (all output tokens / wall time from the first
start to the last `done`), TTFT and ITL (p50, p99) per client, for our engine (SmolLM2, chat, plain
decoding) and for vLLM (plain, 1 thread, float32), the two alternated at each concurrency.
"""
from __future__ import annotations

import asyncio
import time

from cli.bench.serve import many, merge, ms
from cli.bench.served import Server, get_json
from engine.external.vllm_server import VARIANTS

CONCURRENCY = (1, 4, 16)
READY_TIMEOUT_S = 900.0


def wait_for_vllm(base: str) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        vllm = [m for m in get_json(base + "/api/models")["models"] if m.get("engine") == "vllm"]
        if vllm and all(m["ready"] for m in vllm):
            return vllm[0]
        failed = [m.get("error") for m in vllm if m.get("state") == "failed"]
        if failed or not vllm or time.monotonic() > deadline:
            raise SystemExit(f"bench serve --engine vllm: vLLM is not ready: {failed or vllm or 'not offered'}")
        time.sleep(1.0)


def run_vllm_sweep(args) -> dict:
    engines = {"ours": {"model": "smollm2-135m", "chat": True, "method": "none", "max_tokens": args.max_tokens},
               "vllm": {"model": VARIANTS["plain"].label, "max_tokens": args.max_tokens}}
    rows = []
    n = max(CONCURRENCY)
    with Server("--vllm", "--vllm-variants", "plain", "--no-llamacpp", "--max-sessions", str(n), "--max-queue",
                str(n), models_dir=args.models_dir, start_timeout_s=120.0) as srv:
        described = wait_for_vllm(srv.base)
        ws_base = srv.base.replace("http://", "ws://")
        for settings in engines.values():                                   # warm up both
            asyncio.run(many(ws_base, 1, {**settings, "max_tokens": 8}))
        for concurrency in CONCURRENCY:
            runs = {name: [] for name in engines}
            for _ in range(args.repeats):
                for name, settings in engines.items():
                    runs[name].append(asyncio.run(many(ws_base, concurrency, settings)))
            for name, got in runs.items():
                r = merge(got)
                rows.append({"engine": name, "concurrency": concurrency, "tokens_per_s": r["tokens_per_s"],
                             "ttft_p50_ms": ms(r["ttft_s"]["p50"]), "ttft_p99_ms": ms(r["ttft_s"]["p99"]),
                             "itl_p50_ms": ms(r["itl_s"]["p50"]), "itl_p99_ms": ms(r["itl_s"]["p99"]),
                             "errors": r["errors"], "error_messages": r["error_messages"]})
    return {"max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows, "vllm": described}


def _ms(x) -> str:
    return "–" if x is None else f"{x:.0f}"


def vllm_sweep_markdown(r: dict) -> str:
    v = r["vllm"]
    lines = [f"Our engine and vLLM ({v['name']}: {v['threads']} thread, {v['dtype']}, {v['mode']}) through one "
             f"`serve --vllm` and its websockets, {r['max_tokens']} output tokens, the same prompts, medians of "
             f"{r['repeats']} alternated runs:", "",
             "| engine | sessions | tokens/s (all) | TTFT p50 / p99 ms | ITL p50 / p99 ms | errors |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        tps = f"{row['tokens_per_s']:.1f}" if row["tokens_per_s"] else "–"
        lines.append(f"| {row['engine']} | {row['concurrency']} | {tps} | {_ms(row['ttft_p50_ms'])} / "
                     f"{_ms(row['ttft_p99_ms'])} | {_ms(row['itl_p50_ms'])} / {_ms(row['itl_p99_ms'])} | "
                     f"{row['errors']} |")
    return "\n".join(lines)
