"""`decoding-playground bench page`: does the page keep up with the engine? The engine alone, /ws with a plain
client, the page in Chromium, taking turns; `--model NAME`: the page at 1 and N threads.
"""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from statistics import median

from cli.bench.browser import PROMPT, browser_run, chromium_tab
from cli.bench.lib import add_bench, generation, goals, table, take_turns
from cli.bench.served import RUN_DONE, TOKEN, Server, client, pcts, per_thread_count

GOAL_RATIO = 0.90
GOAL_LONG_TASK_MS = 50.0
GOAL_GAP = 1.5            # --model: p99 gap between tokens in the page at most this many engine steps
CASES = [  # (label, settings): plain decoding has the most rounds per second, the hardest case for the page
    ("plain decoding (method none)", {"method": "none"}),
    ("draft model, γ = 4", {"method": "draft_model", "num_speculative_tokens": 4}),
]


def engine_run(engine, settings: dict) -> dict:
    wall, done, _ = generation(engine, PROMPT, settings)
    n = done["num_output_tokens"]
    return {"tokens": n, "wall_s": wall, "tokens_per_s": n / wall}


def ws_run(base_url: str, settings: dict, timeout_s: float = 120) -> dict:
    """/ws read by a plain websocket client: what the server delivers when nothing else needs the CPU."""
    from websockets.sync.client import connect

    fields = {"prompt": PROMPT, "speed": "max", "action": "toggle", **{k: str(v) for k, v in settings.items()}}
    tokens = 0
    with connect(base_url.replace("http://", "ws://") + "/ws", max_size=2 ** 24, open_timeout=10) as ws:
        ws.recv(timeout=timeout_s)                                 # hello
        t0 = time.perf_counter()
        ws.send(json.dumps(fields))
        received = 1
        while True:
            message = ws.recv(timeout=timeout_s)
            received += 1
            ws.send(json.dumps({"ack": received}))          # as the page does after rendering a message
            tokens += sum(status != "rejected" for status in TOKEN.findall(message))
            if RUN_DONE.search(message):
                break
        wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def run_page(models_dir, max_tokens: int, repeats: int) -> dict:
    from app.config import AppConfig
    from engine.serving.registry import InferenceEngine, ModelRegistry

    config = AppConfig.from_env()
    registry = ModelRegistry.from_dir(models_dir or config.models_dir, fetched=False)
    engine = InferenceEngine(registry)
    target = registry.default_target()
    cases = []
    with Server("--max-sessions", str(config.max_sessions), models_dir=models_dir) as srv, chromium_tab("page") as page:
        for label, settings in CASES:
            # the model named: a page left to choose opens on SmolLM2's demo where it is fetched
            settings = {**settings, "model": target.name, "chat": "false", "max_tokens": max_tokens}
            engine_run(engine, settings)                       # warm-up: pools, caches, the tab's window
            browser_run(page, srv.base, settings)
            runs = take_turns({"engine": lambda: engine_run(engine, settings),
                               "websocket": lambda: ws_run(srv.base, settings),
                               "browser": lambda: browser_run(page, srv.base, settings)}, repeats)
            eng, sock, web = runs["engine"], runs["websocket"], runs["browser"]
            ratio = {k: [y["tokens_per_s"] / x["tokens_per_s"] for x, y in zip(a, b)]
                     for k, a, b in (("ws", eng, sock), ("browser", eng, web), ("browser_vs_ws", sock, web))}
            cases.append({"case": label, "tokens": web[-1]["tokens"],
                          **{f"{k}_tokens_per_s": median(x["tokens_per_s"] for x in v) for k, v in runs.items()},
                          "ws_ratio": median(ratio["ws"]), "ratio": median(ratio["browser"]),
                          "ratio_min": min(ratio["browser"]), "browser_vs_ws": median(ratio["browser_vs_ws"]),
                          "first_token_ms": median(w["first_token_ms"] for w in web),
                          "chromium_cpu_ms": median(w["chromium_cpu_s"] * 1e3 for w in web),
                          "messages": median(w["messages"] for w in web), "runs": runs,
                          "long_tasks": sum(w["long_tasks"] for w in web),
                          "max_long_task_ms": max(w["max_long_task_ms"] for w in web)})
    return {"max_tokens": max_tokens, "repeats": repeats, "cases": cases,
            "models": f"{target.name} ({target.model.num_parameters:,} parameters) and its draft"}


def run_page_threads(args) -> dict:
    counts = sorted({1, max(1, args.threads)})
    settings = {"model": args.model, "method": "none", "chat": "true", "max_tokens": args.max_tokens}
    api = {**settings, "chat": True}
    with per_thread_count(args.model, counts, "--max-sessions", "2", models_dir=args.models_dir) as servers, \
            chromium_tab("page") as page:
        for s in servers.values():                       # warm-up: pools, caches, the tab's window
            browser_run(page, s.base, settings)

        def turn(s):              # the client in a thread of its own: Playwright's sync API holds this one's loop
            with ThreadPoolExecutor(1) as pool:
                alone = pool.submit(asyncio.run, client(s.base.replace("http://", "ws://"), 0, api)).result()
            return {"tpot_s": alone["tpot_s"], "page": browser_run(page, s.base, settings)}
        runs = take_turns({t: lambda s=s: turn(s) for t, s in servers.items()}, args.repeats)
    rows = {}
    for t, r in runs.items():
        step_ms = median(x["tpot_s"] for x in r if x["tpot_s"]) * 1e3
        pages = [x["page"] for x in r]
        gaps = pcts([g for x in pages for g in x["token_gaps_ms"]])
        rows[t] = {"step_ms": step_ms, "page_tokens_per_s": median(x["tokens_per_s"] for x in pages),
                   "gaps": gaps["n"], "median_gap_ms": gaps["p50"], "p99_gap_ms": gaps["p99"],
                   "max_gap_ms": gaps.get("max"),
                   "p99_over_step": gaps["p99"] / step_ms if gaps["p99"] else None,
                   "chromium_cores": sum(x["chromium_cpu_s"] for x in pages) / sum(x["wall_s"] for x in pages),
                   "long_tasks": sum(x["long_tasks"] for x in pages)}
    return {"settings": settings, "repeats": args.repeats, "rows": rows}


def tables(r: dict) -> list[str]:
    rows = [[c["case"], c["tokens"], f"{c['engine_tokens_per_s']:.0f}",
             f"{c['websocket_tokens_per_s']:.0f} ({c['ws_ratio']:.0%})", f"{c['browser_tokens_per_s']:.0f}",
             f"{c['ratio']:.1%} ({c['ratio_min']:.1%})", f"{c['browser_vs_ws']:.0%}", f"{c['first_token_ms']:.0f}",
             f"{c['messages']:.0f}", f"{c['chromium_cpu_ms']:.0f}", f"{c['long_tasks']} ({c['max_long_task_ms']:.0f})",
             c["ratio"] >= GOAL_RATIO and c["max_long_task_ms"] <= GOAL_LONG_TASK_MS] for c in r["cases"]]
    return [table(["case", "output tokens", "engine alone tok/s", "/ws, no browser tok/s (÷ engine)",
                   "in the browser tok/s", "browser ÷ engine (min)", "browser ÷ /ws", "first token ms",
                   "messages per run", "Chromium CPU ms per load + run", "long tasks > 50 ms (max ms)",
                   f"goal met (>= {GOAL_RATIO:.0%}, no long task > {GOAL_LONG_TASK_MS:.0f} ms)"], rows,
                  f"{r['models']}; {r['max_tokens']} tokens, {r['repeats']} runs a side, medians")]


def threads_tables(r: dict) -> list[str]:
    s, rows = r["settings"], r["rows"]
    top = max(rows)
    more = rows[top]["page_tokens_per_s"] / rows[1]["page_tokens_per_s"]
    return [table(["threads", "engine step ms", "page tok/s", "gaps", "median gap ms", "p99 gap ms (÷ step)",
                   "longest gap ms", "Chromium's cores", "long tasks"],
                  [[t, x["step_ms"], x["page_tokens_per_s"], x["gaps"], x["median_gap_ms"],
                    f"{x['p99_gap_ms'] or 0:.1f} ({x['p99_over_step'] or 0:.2f}x)", x["max_gap_ms"],
                    x["chromium_cores"], x["long_tasks"]] for t, x in rows.items()],
                  f"{s['model']}, plain decoding, chat, {s['max_tokens']} tokens, {r['repeats']} repeats"),
            goals(([(f"page tokens/s at {top} threads over 1", more, ">=", 1.01)] if top > 1 else [])
                  + [(f"p99 gap ÷ the step at {t} thread(s)", x["p99_over_step"], "<=", GOAL_GAP)
                     for t, x in rows.items()])]


def measure(args) -> dict:
    if args.quick:
        args.max_tokens, args.repeats = 120, 2
    if args.model:
        return {**run_page_threads(args), "section": "page threads"}
    return run_page(args.models_dir, args.max_tokens, args.repeats)


def add_parser(bsub) -> None:
    b = add_bench(bsub, "page", "tokens/s arriving in the browser vs the engine alone; long tasks", measure,
                  lambda r: threads_tables(r) if "rows" in r else tables(r), quick="2 repeats, 120 tokens",
                  models_dir=True)
    b.add_argument("--max-tokens", type=int, default=400, help="output tokens per generation (default 400)")
    b.add_argument("--repeats", type=int, default=5, help="runs per side and case (default 5)")
    b.add_argument("--model", default=None, help="the page on one fetched model (smollm2-135m) at 1 and N threads")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N", help="with --model: against 1 thread (default 2)")
