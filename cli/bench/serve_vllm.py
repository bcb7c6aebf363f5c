"""`bench serve --engine vllm`: vLLM against our engine through one `decoding-playground serve --vllm` and its
websockets, on the same SmolLM2 weights and prompts, at 1, 4 and 16 sessions taking turns; and vLLM without the
page, the same requests straight to its port (the bench sets its port and key), for what the page costs it.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import time

import httpx

from cli.bench.lib import machine, table, take_turns
from cli.bench.serve_clients import PROMPTS, figures, many, merge, p50_p99
from cli.bench.served import Server, get_json
from engine.external.vllm_server import SERVED_NAME, free_port
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


async def direct_client(client: httpx.AsyncClient, url: str, key: str, i: int, max_tokens: int,
                        gate: asyncio.Event) -> dict:
    """One chat request straight to vLLM (no page): its tokens, TTFT and gaps between chunks, on this clock."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "return_token_ids": True}
    out = {"ok": False, "tokens": 0, "ttft_s": None, "itl_s": [], "error": None}
    await gate.wait()
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                ids = [t for c in json.loads(line[6:]).get("choices", []) for t in c.get("token_ids") or []]
                if ids:
                    now = time.perf_counter()
                    if out["ttft_s"] is None:
                        out["ttft_s"] = now - t0
                    else:
                        out["itl_s"].append(now - last)
                    last, out["tokens"] = now, out["tokens"] + len(ids)
        out.update(ok=r.status_code == 200, started_at=t0, done_at=last)
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def direct(url: str, key: str, n: int, max_tokens: int) -> dict:
    """`many` without the page: n requests at once straight to vLLM."""
    gate = asyncio.Event()
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=httpx.Limits(max_connections=n)) as client:
        tasks = [asyncio.create_task(direct_client(client, url, key, i, max_tokens, gate)) for i in range(n)]
        await asyncio.sleep(0.2)
        gate.set()
        results = await asyncio.gather(*tasks)
    return figures(n, results)


def run_vllm_sweep(args) -> dict:
    started = machine()
    engines = {"ours": {"model": "smollm2-135m", "chat": True, "method": "none", "max_tokens": args.max_tokens},
               "vllm": {"model": VARIANTS["plain"].label, "max_tokens": args.max_tokens}}
    rows = []
    n = max(CONCURRENCY)
    port, key = free_port(), secrets.token_urlsafe(24)
    os.environ["DECODING_PLAYGROUND_VLLM_API_KEY"] = key            # the served process's environment
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with Server("--vllm", "--vllm-variants", "plain", "--vllm-port", str(port), "--no-llamacpp", "--max-sessions",
                str(n), "--max-queue", str(n), models_dir=args.models_dir, start_timeout_s=120.0) as srv:
        described = wait_for_vllm(srv.base)
        ws_base = srv.base.replace("http://", "ws://")
        for settings in engines.values():                                   # warm up both
            asyncio.run(many(ws_base, 1, {**settings, "max_tokens": 8}))
        for concurrency in CONCURRENCY:
            sides = {name: lambda s=settings: asyncio.run(many(ws_base, concurrency, s))
                     for name, settings in engines.items()}
            sides["vllm, no page"] = lambda: asyncio.run(direct(url, key, concurrency, args.max_tokens))
            for name, got in take_turns(sides, args.repeats).items():
                rows.append({"engine": name, "concurrency": concurrency, **merge(got)})
    return {"machine": started, "max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows, "vllm": described}


def vllm_tables(r: dict) -> list[str]:
    v = r["vllm"]
    by = {(row["engine"], row["concurrency"]): row["tokens_per_s"] for row in r["rows"]}
    return [table(["engine", "sessions", "tokens/s (all)", "TTFT p50 / p99 ms", "ITL p50 / p99 ms", "errors"],
                  [[x["engine"], x["concurrency"], x["tokens_per_s"], p50_p99(x["ttft_s"]), p50_p99(x["itl_s"]),
                    x["errors"]] for x in r["rows"]],
                  f"Our engine and vLLM ({v['name']}: {v['threads']} thread, {v['dtype']}, {v['mode']}) through one "
                  f"`serve --vllm`, {r['max_tokens']} tokens, {r['repeats']} turns"),
            table(["sessions", "what the page costs vLLM's tokens/s (1 - through the page / straight to its port)"],
                  [[c, f"{1 - by[('vllm', c)] / by[('vllm, no page', c)]:+.1%}"] for c in CONCURRENCY
                   if by.get(("vllm", c)) and by.get(("vllm, no page", c))])]
