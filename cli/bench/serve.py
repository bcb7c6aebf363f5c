"""`decoding-playground bench serve`: a real server under /api/ws clients, alone and N at once, watchers, the
engine alone; `--sweep`: γ x concurrency, the fastest γ per concurrency stored as the model's and method's `batch`
schedule (engine/spec_decode/batch_schedule.py); `--model`: the room per thread count, or the sweep's model;
`--engine vllm`: ours against vLLM; `--workload`: what the clients ask (engine/experiments/serve_workloads.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import time

import httpx

from cli.bench.lib import add_bench, goals, pooled, table, take_turns
from cli.bench.served import (PROMPTS, RUN_DONE, Server, client, figures, many, merge, ms, p50_p99, pcts, per_thread_count,
                              wait_until_loaded)
from engine.experiments.serve_figures import over_best_fixed
from engine.experiments.serve_workloads import WORKLOADS, make_workload
from engine.external.vllm_server import SERVED_NAME, VARIANTS, free_port
from engine.serving.settings import METHODS
from engine.spec_decode.batch_schedule import fastest_gamma, store_table, table_from_sweep

SWEEP_GAMMAS = ("none", 2, 4, 6)
ADAPTIVE = ("acceptance", "batch")   # the sweep's adaptive schedules, from its largest γ (target: 0.95x the best)
CONCURRENCY = (1, 4, 16)      # sessions at once: the sweep's, the room's and vLLM's against ours
KNEE_GAIN = 1.25       # tokens/s from one concurrency to the next (4x the sessions) below this: past the knee


def add_parser(bsub) -> None:
    bp = add_bench(bsub, "serve", "N websocket clients against a real server: tokens/s, TTFT, ITL, errors, blocks left; "
                   "watchers; the γ x load sweep", measure, lambda r: TABLES[r["section"]](r), models_dir=True)
    bp.add_argument("--clients", type=int, default=32, help="concurrent generating clients (default 32)")
    bp.add_argument("--watchers", type=int, default=200, help="watchers of one session (default 200; 0: skip)")
    bp.add_argument("--max-tokens", type=int, default=128, help="output tokens per generation (default 128)")
    bp.add_argument("--method", default="draft_model", choices=METHODS, help="the clients' (default draft_model)")
    bp.add_argument("--workload", default="code", choices=WORKLOADS, help="what the clients ask (default code)")
    bp.add_argument("--num-speculative-tokens", type=int, default=4, help="γ (default 4)")
    bp.add_argument("--speculative-eagle-topk", type=int, default=1,
                    help="children per expanded node: above 1 the clients draft token trees (default 1, a chain)")
    bp.add_argument("--speculative-num-draft-tokens", type=int, default=None, help="a tree's nodes verified")
    bp.add_argument("--repeats", type=int, default=5, help="turns of one alone and all at once (default 5)")
    bp.add_argument("--sweep", action="store_true", help="γ in {none, 2, 4, 6} and the schedules acceptance and batch "
                    "(from γ 6) x concurrency in {1, 4, 16}")
    bp.add_argument("--engine", choices=("ours", "vllm"), default="ours",
                    help="vllm: our engine against vLLM at 1, 4 and 16 sessions through `serve --vllm`")
    bp.add_argument("--model", default=None, help="the room on one model (e.g. smollm2-135m): 1, 4 and 16 sessions at "
                    "1 .. --threads threads; with --sweep: the sweep's model (default target-mha)")
    bp.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                    help="with --model: a server per thread count 1 .. N, taking turns (default 2)")


# --- the server ---------------------------------------------------------------------------------------------
def sessions(n: int) -> tuple[str, ...]:
    """A server's flags for n sessions at once, none of them queued behind another."""
    return "--max-sessions", str(n), "--max-queue", str(n), "--max-connections", "2000"


def blocks_left(srv: Server, timeout_s: float = 10.0) -> dict:
    """/api/stats once every session has been let go (polled until 0 blocks, at most `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = srv.stats()
        if (stats["kv_blocks_used"] == 0 and stats["sessions"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


async def watchers(ws_base: str, n: int, settings: dict) -> dict:
    """n watchers on /watch/{id}/ws of one presenter (they join first); each must see its run end."""
    import websockets

    from app.watch.rooms import watch_id_for

    key = "bench-serve-presenter-0001"
    connected, counts, done_at, errors = asyncio.Event(), {"connected": 0, "failed": 0}, [], []

    def joined(how: str) -> None:
        counts[how] += 1
        if counts["connected"] + counts["failed"] >= n:
            connected.set()

    async def watcher() -> None:
        try:
            async with websockets.connect(f"{ws_base}/watch/{watch_id_for(key)}/ws", max_size=2 ** 24, open_timeout=60,
                                          ping_timeout=60, compression=None) as ws:
                joined("connected")
                async with asyncio.timeout(600):
                    async for message in ws:
                        if RUN_DONE.search(message):
                            done_at.append(time.perf_counter())
                            return
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
            if counts["connected"] + counts["failed"] < n:
                joined("failed")

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
    """n sessions through the Scheduler in this process (no server): output tokens / wall time."""
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

    eng = InferenceEngine(ModelRegistry.from_dir(models_dir or AppConfig().models_dir), max_sessions=max(n, 1))
    engine_tokens_per_s(eng, n, settings)                      # warm up, as the server's run
    runs = take_turns({"one": lambda: [engine_tokens_per_s(eng, 1, settings) for _ in range(3)],
                       "many": lambda: engine_tokens_per_s(eng, n, settings)}, repeats)
    a, c = (statistics.median(pooled(v)) for v in runs.values())
    return {"alone_tokens_per_s": a, "concurrent_tokens_per_s": c, "ratio": c / a}


# --- the runs ----------------------------------------------------------------------------------------------
def settings_of(method: str, gamma, max_tokens: int, model: str | None = None, chat: bool = False) -> dict:
    base = {"max_tokens": max_tokens, **({"model": model} if model else {}), **({"chat": True} if chat else {})}
    if method == "none" or gamma == "none":
        return {**base, "method": "none"}
    if gamma in ADAPTIVE:
        return {**base, "method": method, "num_speculative_tokens": 6, "num_speculative_tokens_schedule": gamma}
    return {**base, "method": method, "num_speculative_tokens": int(gamma)}


def ask(ws_base: str, n: int, settings: dict, workload=None) -> dict:
    """`many` with the workload's prompts (None: the code prompts), its answers handed back to it."""
    r = asyncio.run(many(ws_base, n, settings, workload and workload.prompts(n)))
    if workload:
        workload.answered(r["texts"])
    return r


def run_main(args) -> dict:
    wl = {side: make_workload(args.workload) for side in ("alone", "concurrent")}
    settings = settings_of(args.method, args.num_speculative_tokens, args.max_tokens)   # the default model: no chat
    if args.speculative_eagle_topk != 1:
        settings.update(speculative_eagle_topk=args.speculative_eagle_topk,
                        speculative_num_draft_tokens=args.speculative_num_draft_tokens)
    out = {"settings": settings, "repeats": args.repeats, "workload": args.workload}
    with Server(*sessions(max(args.clients, 1)), models_dir=args.models_dir) as srv:
        ws_base = srv.ws("")
        # warm up: weights, caches, and the KV pools' memory (first touched by the first run at full load)
        ask(ws_base, args.clients, settings, make_workload(args.workload))
        for _ in range(3):
            ask(ws_base, 1, settings)
        # one alone is short and noisy: three of them a turn; tokens/s the median, latencies pooled
        runs = take_turns({"alone": lambda: [ask(ws_base, 1, settings, wl["alone"]) for _ in range(3)],
                           "concurrent": lambda: ask(ws_base, args.clients, settings, wl["concurrent"])}, args.repeats)
        out["alone"], out["concurrent"] = merge(pooled(runs["alone"])), merge(runs["concurrent"])
        out["after_all_left"] = {k: v for k, v in blocks_left(srv).items() if k in ("sessions", "kv_blocks_used",
                                                                                    "kv_blocks_total", "connections")}
        if args.watchers:
            out["watch"] = asyncio.run(watchers(ws_base, args.watchers, settings))
            out["after_watchers_left"] = {k: v for k, v in blocks_left(srv).items()
                                          if k in ("sessions", "kv_blocks_used", "watchers")}
        out["server"] = srv.stats()["engine"]
    out["engine_alone"] = engine_alone(args.clients, settings, args.repeats, args.models_dir)   # server stopped
    c, a = out["concurrent"], out["alone"]
    out["ratio_to_alone"] = (c["tokens_per_s"] / a["tokens_per_s"]) if c["tokens_per_s"] and a["tokens_per_s"] else None
    return out


def run_sweep(args) -> dict:
    """Each cell its own workload (the same prompts, turn by turn); the warm-up asks the workload's first requests
    (a workshop's: its presenter's run of the questions, which suffix decoding drafts from afterwards)."""
    rows, model, method = [], args.model or "target-mha", "draft_model" if args.method == "none" else args.method
    with Server("--no-llamacpp", *sessions(max(CONCURRENCY)), models_dir=args.models_dir) as srv:
        ws_base, chat = srv.ws(""), args.workload != "code" and wait_until_loaded(srv.base, model).get("chat", False)
        cell = lambda g: settings_of(method, g, args.max_tokens, model, chat)  # noqa: E731 - chat: where it can
        ask(ws_base, max(CONCURRENCY), cell(4), make_workload(args.workload))                          # warm up
        for g in SWEEP_GAMMAS + ADAPTIVE:       # and each cell's settings once: no cell pays a first use in its turns
            ask(ws_base, 1, cell(g), make_workload(args.workload))
        for concurrency in CONCURRENCY:
            asked = {g: make_workload(args.workload) for g in SWEEP_GAMMAS + ADAPTIVE}
            runs = take_turns({g: lambda g=g: ask(ws_base, concurrency, cell(g), asked[g]) for g in asked},
                              args.repeats)
            baseline = merge(runs["none"])["tokens_per_s"]
            for gamma in asked:
                r = merge(runs[gamma])
                rows.append({"gamma": gamma, "concurrency": concurrency, "tpot_ms": ms(r["tpot_s"]),
                             "itl_s": r["itl_s"], "tokens_per_s": r["tokens_per_s"],
                             "mean_acceptance_length": r["mean_acceptance_length"],
                             "ratio": r["tokens_per_s"] / baseline if baseline and r["tokens_per_s"] else None,
                             "errors": r["errors"]})
        left = blocks_left(srv)
    best = {c: fastest_gamma({x["gamma"]: x["tokens_per_s"] for x in rows if x["concurrency"] == c
                              and x["gamma"] in SWEEP_GAMMAS}) for c in CONCURRENCY}
    out = {"max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows, "model": model, "method": method,
           "workload": args.workload, "kv_blocks_used_after": left["kv_blocks_used"], "table": table_from_sweep(best)}
    if not args.no_write:
        store_table(model, method, out["table"], f"bench serve --sweep, {args.workload} workload, {args.max_tokens} "
                    f"tokens, {args.repeats} turns, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return out


def run_room(args) -> dict:
    """The workshop room: 1, 4 and 16 sessions on a server per thread count, the counts taking turns."""
    counts = list(range(1, max(1, args.threads) + 1))
    settings = {"model": args.model, "method": "none", "chat": True, "max_tokens": args.max_tokens}
    with per_thread_count(args.model, counts, *sessions(max(CONCURRENCY)), models_dir=args.models_dir) as servers:
        ws = {t: s.ws("") for t, s in servers.items()}
        for t in counts:                            # warm up: the KV pools are touched
            asyncio.run(many(ws[t], max(CONCURRENCY), settings))
        results = {c: take_turns({t: lambda t=t: asyncio.run(many(ws[t], c, settings)) for t in counts}, args.repeats)
                   for c in CONCURRENCY}
    rows = {t: {c: merge(results[c][t]) for c in CONCURRENCY} for t in counts}
    return {"settings": settings, "repeats": args.repeats, "rows": rows,
            "knee": {t: knee(rows[t]) for t in counts}}


def knee(by_concurrency: dict) -> dict:
    """The gain of each step of concurrency, and the last one before it fell below KNEE_GAIN."""
    cs = sorted(by_concurrency)
    tps = {c: by_concurrency[c]["tokens_per_s"] for c in cs}
    gains = {f"{a}->{b}": tps[b] / tps[a] for a, b in zip(cs, cs[1:]) if tps[a] and tps[b]}
    at = next((a for a, b in zip(cs, cs[1:]) if tps[a] and tps[b] and tps[b] / tps[a] < KNEE_GAIN), None)
    return {"gains": gains, "at": at}


def main_tables(r: dict) -> list[str]:
    a, c = r["alone"], r["concurrent"]
    rows = [[label, x["clients"], x["errors"], x["tokens_per_s"], p50_p99(x["ttft_s"]), p50_p99(x["itl_s"]),
             ms(x["tpot_s"])] for label, x in (("one alone", a), (f"{c['clients']} at once", c))]
    g = r["engine_alone"]
    rows.append([f"the engine alone, one / {c['clients']} at once (no server)", None, None,
                 f"{g['alone_tokens_per_s']:.1f} / {g['concurrent_tokens_per_s']:.1f}", None, None, None])
    rows.append(["the server ÷ the engine alone", None, None, f"{a['tokens_per_s'] / g['alone_tokens_per_s']:.0%} / "
                 f"{c['tokens_per_s'] / g['concurrent_tokens_per_s']:.0%}", None, None, None])
    w, e = r.get("watch"), r.get("server", {})
    if w:
        rows.append(["watchers of one session (connected)", w["connected"], w["errors"], None, None, None, None])
    return [table(["", "clients", "errors", "output tok/s", "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)", "TPOT (ms)"],
                  rows, f"Settings {json.dumps(r['settings'])}, full speed, /api/ws, {r['repeats']} turns; "
                  f"{e.get('batched_requests', 0) / max(1, e.get('batches', 0)):.1f} forward requests a batch"
                  + (f"; the watchers saw `done` {p50_p99(w['lag_after_presenter_done_s'])} ms after the presenter"
                     if w else "")),
            goals([("aggregate tokens/s over one alone", r["ratio_to_alone"], ">=", 2),
                   ("p99 ITL ms", ms(c["itl_s"]["p99"]), "<=", 250),
                   ("errors", c["errors"] + (w["errors"] if w else 0), "<=", 0),
                   ("KV blocks in use after every client left", r["after_all_left"]["kv_blocks_used"], "<=", 0)])]


def sweep_tables(r: dict) -> list[str]:
    return [table(["γ", "concurrency", "TPOT (ms)", "ITL p50 / p99 (ms)", "output tok/s", "mean acceptance length",
                   "tok/s over no speculation", "errors"],
                  [[x["gamma"], x["concurrency"], x["tpot_ms"], p50_p99(x["itl_s"]), x["tokens_per_s"],
                    x["mean_acceptance_length"], x["ratio"], x["errors"]] for x in r["rows"]],
                  f"{r.get('model', 'target-mha')}, {r.get('method', 'draft_model')}, {r.get('workload', 'code')} "
                  f"workload, {r['max_tokens']} tokens a client, full speed, {r['repeats']} turns a cell; KV blocks in "
                  f"use after the sweep: {r['kv_blocks_used_after']}; the table it makes for the `batch` schedule (γ 0: "
                  f"off; its batch cells ran the one stored before): {r.get('table')}"),
            goals([(f"{a} over the best fixed γ, {c} sessions", v, ">=", 0.95) for (a, c), v in
                   over_best_fixed(r["rows"], SWEEP_GAMMAS, ADAPTIVE).items()])]


def room_tables(r: dict) -> list[str]:
    s, ts = r["settings"], sorted(r["rows"])
    rows = [[t, c, x["errors"], x["tokens_per_s"], p50_p99(x["ttft_s"]), p50_p99(x["itl_s"])]
            for t, by in r["rows"].items() for c, x in by.items()]
    knees = [[t, ", ".join(f"{step}: {g:.2f}x" for step, g in k["gains"].items()),
              k["at"] or f"none up to {max(CONCURRENCY)}"] for t, k in r["knee"].items()]
    out = [table(["threads", "sessions", "errors", "output tok/s", "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)"], rows,
                 f"{s['model']}, plain decoding, chat, {s['max_tokens']} tokens, a server per thread count, "
                 f"{r['repeats']} turns"),
           table(["threads", "tokens/s gained per 4x sessions", f"the knee (a 4x gaining less than {KNEE_GAIN}x)"], knees)]
    if len(ts) > 1:
        a, b = ts[0], ts[-1]
        out.append(table(["sessions", f"tokens/s, {b} threads over {a}"],
                         [[c, r["rows"][b][c]["tokens_per_s"] / r["rows"][a][c]["tokens_per_s"]] for c in CONCURRENCY
                          if r["rows"][b][c]["tokens_per_s"] and r["rows"][a][c]["tokens_per_s"]]))
    return out


# --- vLLM against ours -------------------------------------------------------------------------------------
async def direct_client(client: httpx.AsyncClient, url: str, key: str, prompt: str, max_tokens: int,
                        gate: asyncio.Event) -> dict:
    """One chat request straight to vLLM (no page): its tokens, text, TTFT and gaps between chunks, on this clock."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "return_token_ids": True}
    out = {"ok": False, "tokens": 0, "ttft_s": None, "itl_s": [], "error": None, "text": ""}
    await gate.wait()
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices", [])
                ids = [t for c in choices for t in c.get("token_ids") or []]
                out["text"] += "".join((c.get("delta") or {}).get("content") or "" for c in choices)
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


async def direct(url: str, key: str, n: int, max_tokens: int, workload=None) -> dict:
    """`ask` without the page: n requests at once straight to vLLM."""
    gate, prompts = asyncio.Event(), workload.prompts(n) if workload else [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=httpx.Limits(max_connections=n)) as client:
        tasks = [asyncio.create_task(direct_client(client, url, key, p, max_tokens, gate)) for p in prompts]
        await asyncio.sleep(0.2)
        gate.set()
        r = figures(n, await asyncio.gather(*tasks))
    if workload:
        workload.answered(r["texts"])
    return r


def run_vllm_sweep(args) -> dict:
    engines = {"ours": {"model": "smollm2-135m", "chat": True, "method": "none", "max_tokens": args.max_tokens},
               "vllm": {"model": VARIANTS["plain"].label, "max_tokens": args.max_tokens}}
    rows, port, key = [], free_port(), secrets.token_urlsafe(24)
    os.environ["DECODING_PLAYGROUND_VLLM_API_KEY"] = key            # the served process's environment
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with Server("--vllm", "--vllm-variants", "plain", "--vllm-port", str(port), "--no-llamacpp",
                *sessions(max(CONCURRENCY)), models_dir=args.models_dir) as srv:
        described, ws_base = wait_until_loaded(srv.base, VARIANTS["plain"].label, 900), srv.ws("")
        for settings in engines.values():                                   # warm up both
            asyncio.run(many(ws_base, 1, {**settings, "max_tokens": 8}))
        for concurrency in CONCURRENCY:
            wl = {name: make_workload(args.workload) for name in (*engines, "vllm, no page")}
            sides = {name: lambda name=name, s=settings: ask(ws_base, concurrency, s, wl[name])
                     for name, settings in engines.items()}
            sides["vllm, no page"] = lambda: asyncio.run(direct(url, key, concurrency, args.max_tokens,
                                                                wl["vllm, no page"]))
            for name, got in take_turns(sides, args.repeats).items():
                rows.append({"engine": name, "concurrency": concurrency, **merge(got)})
    return {"max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows, "vllm": described,
            "workload": args.workload}


def vllm_tables(r: dict) -> list[str]:
    v = r["vllm"]
    by = {(row["engine"], row["concurrency"]): row["tokens_per_s"] for row in r["rows"]}
    return [table(["engine", "sessions", "tokens/s (all)", "TTFT p50 / p99 ms", "ITL p50 / p99 ms", "errors"],
                  [[x["engine"], x["concurrency"], x["tokens_per_s"], p50_p99(x["ttft_s"]), p50_p99(x["itl_s"]),
                    x["errors"]] for x in r["rows"]],
                  f"Our engine and vLLM ({v['name']}: {v['threads']} thread, {v['dtype']}, {v['mode']}) through one "
                  f"`serve --vllm`, {r.get('workload', 'code')} workload, {r['max_tokens']} tokens, {r['repeats']} turns"),
            table(["sessions", "what the page costs vLLM's tokens/s (1 - through the page / straight to its port)"],
                  [[c, f"{1 - by[('vllm', c)] / by[('vllm, no page', c)]:+.1%}"] for c in CONCURRENCY
                   if by.get(("vllm", c)) and by.get(("vllm, no page", c))])]


def measure(args) -> dict:
    if args.engine == "vllm":
        return {**run_vllm_sweep(args), "section": "serve vllm"}
    if args.model and not args.sweep:
        return {**run_room(args), "section": "serve room"}
    return {**run_sweep(args), "section": "serve sweep"} if args.sweep else run_main(args)


TABLES = {"serve": main_tables, "serve sweep": sweep_tables, "serve room": room_tables, "serve vllm": vllm_tables}
