"""What a client's cache settings cost a real server: its resident memory and the KV pools it holds.

    python scripts/pool_memory_probe.py [--max-sessions 2] [--model smollm2-135m] [--hold float16/8] [-- serve options]

Starts `decoding-playground serve` in its own process (no llama.cpp), opens one `/api/ws` generation on the
model, then steps it through every `kv_cache_dtype` at every `block_size` (live settings, one round each) and
prints after each: the server's RSS (/proc/PID/status VmRSS), the pools /api/stats lists and the bytes they
hold (blocks x block size x bytes per token, the pools' own formula), and what the server answered. It ends
with /api/stats and the server stopped. Nothing here asserts: the tests do (tests/engine/test_pool_budget.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head")
BLOCK_SIZES = (16, 8, 32)
GIB = 2 ** 30


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def stats(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/api/stats", timeout=10) as r:
        return json.load(r)


def pool_bytes(s: dict, bytes_per_token: dict) -> int:
    """What /api/stats says the pools hold, or (a server before it said so) blocks x block size x bytes per token."""
    if "kv_pool_bytes" in s:
        return s["kv_pool_bytes"]
    return sum(p["num_blocks"] * p["block_size"] * bytes_per_token[(p["name"], p["kv_cache_dtype"])]
               for p in s["pools"])


async def until(ws, types: set[str], timeout: float = 300) -> dict:
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if os.environ.get("PROBE_DEBUG"):
            print("   <", str(msg)[:160])
        if msg["type"] in types:
            return msg


PROMPT = "Once upon a time, in a small village by the sea, there lived"


def show(what: str, base: str, pid: int, bpt: dict, said: str = "") -> None:
    s = stats(base)
    print(f"{what:>24}  rss {rss(pid) / GIB:5.2f} GiB  pools {len(s['pools']):2d}  "
          f"held {pool_bytes(s, bpt) / GIB:5.2f} GiB  {said}")


async def started(url: str, model: str, settings: dict):
    """A connection with a generation started paused and stepped once (its pools made and in use)."""
    ws = await websockets.connect(url, max_size=None)
    await ws.send(json.dumps({"type": "start", "prompt": PROMPT, "paused": True,
                              "settings": {"model": model, "max_tokens": 4000, **settings}}))
    await until(ws, {"started", "error"})
    await ws.send(json.dumps({"type": "step"}))
    answer = await until(ws, {"metrics", "error"})
    return ws, answer


async def probe(base: str, pid: int, model: str, hold: dict | None) -> None:
    from engine.kv.dtypes import kv_bytes_per_token
    from engine.model.fetched import fetched_models
    from engine.serving.registry import ModelRegistry
    models = list(fetched_models()) + list(ModelRegistry.from_dir(fetched=False).models.values())
    bpt = {}
    for m in models:
        for d in DTYPES:
            bpt[(f"{m.role}:{m.name}", d)] = kv_bytes_per_token(m.cfg, d)
        bpt[(f"eagle:{m.name}-eagle", "auto")] = kv_bytes_per_token(m.cfg.replace(num_hidden_layers=1), "auto")
    url = base.replace("http", "ws") + "/api/ws"
    ws, _ = await started(url, model, {})
    s = stats(base)
    if s.get("kv_cache_memory"):
        print(f"kv_cache_memory {s['kv_cache_memory'] / GIB:.2f} GiB")
    show("start", base, pid, bpt)
    held = None
    if hold:
        held, answer = await started(url, model, hold)
        show(f"another client holds {hold['kv_cache_dtype']}/{hold['block_size']}", base, pid, bpt, answer["type"])
    for bs in BLOCK_SIZES:
        for dtype in DTYPES:
            await ws.send(json.dumps({"type": "settings", "settings": {"kv_cache_dtype": dtype, "block_size": bs}}))
            answer = await until(ws, {"settings_queued", "error"})
            if answer["type"] == "settings_queued":
                await ws.send(json.dumps({"type": "step"}))
                answer = await until(ws, {"metrics", "error", "done"})
            else:                                        # refused: the generation goes on as it was
                await ws.send(json.dumps({"type": "step"}))
                await until(ws, {"metrics"})
            show(f"{dtype} bs {bs}", base, pid, bpt,
                 answer["type"] if answer["type"] != "error" else f"error: {answer['message']}")
            if answer["type"] == "done" or (answer["type"] == "error" and answer.get("setting") is None):
                return
    for conn in filter(None, (ws, held)):
        await conn.send(json.dumps({"type": "stop"}))
        answer = await until(conn, {"done", "error"})
        print("a client stops:", answer["type"], answer.get("finish_reason", answer.get("message", "")))
        await conn.close()
    show("end", base, pid, bpt)
    s = stats(base)
    print(json.dumps({k: s.get(k) for k in ("kv_blocks_used", "kv_blocks_total", "kv_pools_freed", "kv_pools_refused")}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-sessions", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--hold", metavar="DTYPE/BS", help="first, another client runs with this cache dtype and block size "
                                                       "(paused, its pool in use) while the first cycles")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose server runs (default: this one)")
    ap.add_argument("serve_args", nargs="*", help="more options of serve (after --)")
    args = ap.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--no-llamacpp",
           "--max-sessions", str(args.max_sessions), *args.serve_args]
    server = subprocess.Popen(cmd, cwd=args.root, env={**os.environ, "PYTHONPATH": args.root},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                stats(base)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.5)
        time.sleep(1)
        print(f"serve {' '.join(cmd[3:])}: pid {server.pid}")
        hold = None
        if args.hold:
            dtype, _, bs = args.hold.partition("/")
            hold = {"kv_cache_dtype": dtype, "block_size": int(bs or 16)}
        asyncio.run(probe(base, server.pid, args.model, hold))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
