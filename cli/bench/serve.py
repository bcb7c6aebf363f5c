"""`decoding-playground bench serve`: a real server under real websocket clients.

The command starts `decoding-playground serve` on 127.0.0.1 (a separate process, so that the clients'
own Python does not share the server's GIL) and drives it with `websockets` clients on `/api/ws`:

- **one alone**: one client runs a generation (the reference figures);
- **N at once** (`--clients N`): N clients start together, each with its own prompt; reported: aggregate
  output tokens/s (all output tokens / wall time from the first start to the last `done`) and its ratio
  to one alone, per-client TTFT (start sent -> first token received) and ITL (gaps between the arrivals of
  consecutive rounds, each round ending with its `metrics` event) p50 / p99, TPOT, errors (a client
  without its `done`), and the KV blocks still in use once every client has disconnected (`/api/stats`);
- **watchers** (`--watchers W`, default 200): W read-only viewers of one presenter's session on
  `/watch/{id}/ws` (the HTML fragments a phone gets); each must see the run end (`data-state="done"`);
  reported: errors and how long after the presenter's `done` the watchers saw it;
- **the engine alone**: the same sessions through the engine's `Scheduler` in a loop in this process, once
  the server has stopped: the ceiling of both figures above (the server adds sockets, JSON and an event
  loop that shares the GIL with the engine thread), and so of their ratio;
- `--sweep`: γ in {none, 2, 4, 6} x concurrency in {1, 4, 16}: TPOT, ITL, output tokens/s, mean
  acceptance length and the ratio of tokens/s to no speculation at the same concurrency.

Targets (issue 7, this 2-core machine): 32 concurrent sessions with 0 errors, p99 ITL <= 250 ms, aggregate
tokens/s >= 2x one session alone; 200 watchers with 0 errors; 0 blocks in use after everyone leaves.
Results are printed and written into docs/benchmarks.md (section `bench serve`; `--no-write` to skip).
"""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from contextlib import contextmanager

from cli.bench.serve_clients import PROMPTS, client, machine, many, merge, pcts
from cli.bench.serve_report import main_markdown, ms, sweep_markdown
from cli.bench.serve_threads import room_markdown, run_room
from cli.bench.served import Server, common_arguments, get_json

SWEEP_GAMMAS = ("none", 2, 4, 6)
SWEEP_CONCURRENCY = (1, 4, 16)
WATCHER_DONE = re.compile(r'id="run-status"[^>]*data-state="done"')
START_TIMEOUT_S = 60.0


def add_parser(bench_subparsers) -> None:
    bp = bench_subparsers.add_parser("serve", help="N websocket clients against a real server: tokens/s, TTFT, "
                                                   "ITL, errors, blocks left; watchers; the γ x load sweep")
    bp.add_argument("--clients", type=int, default=32, help="concurrent generating clients (default 32)")
    bp.add_argument("--watchers", type=int, default=200, help="watchers of one session (default 200; 0: skip)")
    bp.add_argument("--max-tokens", type=int, default=128, help="output tokens per generation (default 128)")
    bp.add_argument("--method", default="draft_model", choices=("none", "draft_model", "ngram"),
                    help="speculation method of the clients (default draft_model)")
    bp.add_argument("--num-speculative-tokens", type=int, default=4, help="γ (default 4)")
    bp.add_argument("--repeats", type=int, default=5,
                    help="alone / all-at-once pairs, interleaved (default 5; tokens/s: the median)")
    bp.add_argument("--sweep", action="store_true", help="γ in {none, 2, 4, 6} x concurrency in {1, 4, 16}")
    bp.add_argument("--engine", choices=("ours", "vllm"), default="ours",
                    help="vllm: our engine against vLLM at 1, 4 and 16 sessions through `serve --vllm`")
    bp.add_argument("--model", default=None,
                    help="the room on one model (e.g. smollm2-135m): 1, 4 and 16 sessions at 1 .. --threads threads")
    bp.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                    help="with --model: a server per thread count 1 .. N, interleaved (default 2)")
    common_arguments(bp)
    bp.set_defaults(func=run)


# --- the server ---------------------------------------------------------------------------------------------
@contextmanager
def server(max_sessions: int, models_dir: str | None):
    """`decoding-playground serve` on a free port of 127.0.0.1; yields its base URL."""
    with Server("--max-sessions", str(max_sessions), "--max-queue", str(max_sessions), "--max-connections", "2000",
                models_dir=models_dir, start_timeout_s=START_TIMEOUT_S) as srv:
        yield srv.base


def blocks_left(base: str, timeout_s: float = 10.0) -> dict:
    """/api/stats once every session has been let go (polled until 0 blocks, at most `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = get_json(base + "/api/stats")
        if (stats["kv_blocks_used"] == 0 and stats["sessions"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


async def watchers(ws_base: str, n: int, settings: dict) -> dict:
    """n watchers on /watch/{id}/ws of one presenter (they join first); each must see its run end."""
    import websockets

    from app.watch.rooms import watch_id_for

    key = "bench-serve-presenter-0001"
    watch_id = watch_id_for(key)
    connected = asyncio.Event()
    counts = {"connected": 0, "failed": 0}
    done_at: list[float] = []
    errors: list[str] = []

    def settled() -> None:
        if counts["connected"] + counts["failed"] >= n:
            connected.set()

    async def watcher() -> None:
        try:
            async with websockets.connect(f"{ws_base}/watch/{watch_id}/ws", max_size=2 ** 24, open_timeout=60,
                                          ping_timeout=60, compression=None) as ws:
                counts["connected"] += 1
                settled()
                async with asyncio.timeout(600):
                    async for message in ws:
                        if WATCHER_DONE.search(message):
                            done_at.append(time.perf_counter())
                            return
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
            if counts["connected"] + counts["failed"] < n:
                counts["failed"] += 1
                settled()

    tasks = [asyncio.create_task(watcher()) for _ in range(n)]
    try:
        await asyncio.wait_for(connected.wait(), 120)
    except asyncio.TimeoutError:
        pass
    result = await client(ws_base, 0, settings, None, key=key)
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    except asyncio.TimeoutError:
        errors.append("timed out waiting for the watchers to see done")
    lag = [t - result["done_at"] for t in done_at] if result["ok"] else []
    return {"watchers": n, "connected": counts["connected"], "errors": n - len(done_at),
            "error_messages": sorted(set(errors))[:5], "presenter_ok": result["ok"],
            "presenter_tokens": result["tokens"], "lag_after_presenter_done_s": pcts(lag)}


# --- the engine alone: the ceiling the server can reach --------------------------------------------------------
def engine_tokens_per_s(eng, n: int, settings: dict) -> float:
    """n sessions (the clients' prompts and settings) through engine/serving/scheduler.py's Scheduler in a loop, in
    this process: no server, no sockets, no event loop. Output tokens / wall time, sessions created inside
    the timed part (as the server creates them on `start`)."""
    from engine.serving.scheduler import Scheduler, ServedSession
    from engine.serving.session import GenerationSession

    scheduler, tokens = Scheduler(), []

    def sink(event) -> None:
        if event.type == "done":
            tokens.append(event.summary["num_output_tokens"])

    t0 = time.perf_counter()
    for i in range(n):
        prompt = PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS))
        scheduler.add(ServedSession(GenerationSession(eng, prompt, settings)), sink)
    while scheduler.entries:
        scheduler.step()
    return sum(tokens) / (time.perf_counter() - t0)


def engine_alone(n: int, settings: dict, repeats: int, models_dir: str | None) -> dict:
    """The same interleaving as the server's measurement (three runs of one per run of n); medians."""
    from app.config import AppConfig
    from engine.serving.registry import InferenceEngine, ModelRegistry

    config = AppConfig(models_dir=models_dir) if models_dir else AppConfig()
    eng = InferenceEngine(ModelRegistry.from_dir(config.models_dir), max_sessions=max(n, 1))
    engine_tokens_per_s(eng, n, settings)                      # warm up, as the server's run
    one, many_ = [], []
    for _ in range(repeats):
        one += [engine_tokens_per_s(eng, 1, settings) for _ in range(3)]
        many_.append(engine_tokens_per_s(eng, n, settings))
    a, c = statistics.median(one), statistics.median(many_)
    return {"alone_tokens_per_s": a, "concurrent_tokens_per_s": c, "ratio": c / a}


# --- the runs ----------------------------------------------------------------------------------------------
def settings_of(method: str, gamma, max_tokens: int) -> dict:
    if method == "none" or gamma == "none":
        return {"method": "none", "max_tokens": max_tokens}
    return {"method": method, "num_speculative_tokens": int(gamma), "max_tokens": max_tokens}


def run_main(args) -> dict:
    settings = settings_of(args.method, args.num_speculative_tokens, args.max_tokens)
    out = {"settings": settings, "machine": machine()}
    with server(max(args.clients, 1), args.models_dir) as base:
        ws_base = base.replace("http://", "ws://")
        # warm up: weights, caches, and the KV pools' memory (first touched by the first run at full load)
        asyncio.run(many(ws_base, args.clients, settings))
        for _ in range(3):
            asyncio.run(many(ws_base, 1, settings))
        # interleaved, so that the noise of a shared machine hits both sides alike; medians of tokens/s,
        # latencies pooled over the repeats
        alone, concurrent = [], []
        for _ in range(args.repeats):
            for _ in range(3):        # one alone is short (~0.1 s) and noisy: three samples per repeat
                alone.append(asyncio.run(many(ws_base, 1, settings)))
            concurrent.append(asyncio.run(many(ws_base, args.clients, settings)))
        out["alone"], out["concurrent"] = merge(alone), merge(concurrent)
        out["after_all_left"] = {k: v for k, v in blocks_left(base).items() if k in ("sessions", "kv_blocks_used",
                                                                                    "kv_blocks_total", "connections")}
        if args.watchers:
            out["watch"] = asyncio.run(watchers(ws_base, args.watchers, settings))
            out["after_watchers_left"] = {k: v for k, v in blocks_left(base).items()
                                          if k in ("sessions", "kv_blocks_used", "watchers")}
        out["server"] = get_json(base + "/api/stats")["engine"]
    out["engine_alone"] = engine_alone(args.clients, settings, args.repeats, args.models_dir)   # server stopped
    c, a = out["concurrent"], out["alone"]
    out["ratio_to_alone"] = (c["tokens_per_s"] / a["tokens_per_s"]) if c["tokens_per_s"] and a["tokens_per_s"] else None
    return out


def run_sweep(args) -> dict:
    rows = []
    with server(max(SWEEP_CONCURRENCY), args.models_dir) as base:
        ws_base = base.replace("http://", "ws://")
        asyncio.run(many(ws_base, max(SWEEP_CONCURRENCY), settings_of("draft_model", 4, args.max_tokens)))  # warm up
        for concurrency in SWEEP_CONCURRENCY:
            baseline = None
            for gamma in SWEEP_GAMMAS:
                settings = settings_of("draft_model", gamma, args.max_tokens)
                r = merge([asyncio.run(many(ws_base, concurrency, settings)) for _ in range(args.repeats)])
                if gamma == "none":
                    baseline = r["tokens_per_s"]
                rows.append({"gamma": gamma, "concurrency": concurrency, "tpot_ms": ms(r["tpot_s"]),
                             "itl_p50_ms": ms(r["itl_s"]["p50"]), "itl_p99_ms": ms(r["itl_s"]["p99"]),
                             "tokens_per_s": r["tokens_per_s"], "mean_acceptance_length": r["mean_acceptance_length"],
                             "ratio": r["tokens_per_s"] / baseline if baseline and r["tokens_per_s"] else None,
                             "errors": r["errors"]})
        left = blocks_left(base)
    return {"max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows,
            "kv_blocks_used_after": left["kv_blocks_used"],
            "machine": machine()}


def run(args) -> int:
    from cli.bench.engine import write_section

    if args.engine == "vllm":
        from cli.bench.serve_vllm import run_vllm_sweep, vllm_sweep_markdown
        r = run_vllm_sweep(args)
        text = vllm_sweep_markdown(r)
        name = "serve vllm"
    elif args.model:
        r = run_room(args)
        text = room_markdown(r)
        name = "serve room"
    elif args.sweep:
        r = run_sweep(args)
        text = sweep_markdown(r)
        name = "serve sweep"
    else:
        r = run_main(args)
        text = main_markdown(r)
        name = "serve"
    print(json.dumps(r, indent=2, default=str) if args.json else text)
    if not args.no_write:
        write_section(name, text)
    return 0
