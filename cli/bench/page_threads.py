"""`bench page --model smollm2-135m`: the page on SmolLM2 in Chromium on the same machine, 1 against N threads.

A server per thread count (`serve --threads T`, as users run it) and one headless Chromium tab (cli/bench/page.py's
runs: the page loaded with autoplay at full speed, reloaded per run once Chromium is quiet). Per repeat, every
count in turn: first a plain /api/ws client alone (no browser: the engine's step, its TPOT), then the page. The
gaps are what a viewer sees: the times between new tokens appearing in the page's stream (static/playground.js's
`tokenTimes`, one entry per appearance, so a pause that ends with two tokens counts once, whole), pooled over the
repeats.

Targets (issue 33): with N threads the page gets more tokens/s than with 1, at a p99 inter-token gap no worse
than 1.5x the engine's step at N threads.
"""
from __future__ import annotations

import asyncio
import statistics
from concurrent.futures import ThreadPoolExecutor

from cli.bench.serve_report import _f

GOAL_GAP = 1.5


def outside_playwright(coro):
    """Run a coroutine to its end from code that Playwright's sync API runs (its event loop holds this thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def run_page_threads(args) -> dict:
    from playwright.sync_api import sync_playwright

    from cli.bench.browser import CHROMIUM, browser_run, new_tab, wait_until_quiet
    from cli.bench.serve_clients import client, pcts
    from cli.bench.serve_threads import wait_until_loaded
    from cli.bench.served import Server

    counts = sorted({1, max(1, args.threads)})
    settings = {"model": args.model, "method": "none", "chat": "true", "max_tokens": args.max_tokens}
    api = {"model": args.model, "method": "none", "chat": True, "max_tokens": args.max_tokens}
    if not CHROMIUM.exists():
        raise SystemExit(f"bench page needs Chromium at {CHROMIUM} (make browser)")
    runs = {t: {"tpot_s": [], "page": []} for t in counts}
    servers = {}
    try:
        for t in counts:
            servers[t] = Server("--threads", str(t), "--no-llamacpp", "--max-sessions", "2",
                                models_dir=args.models_dir, start_timeout_s=120)
        for s in servers.values():
            wait_until_loaded(s.base, args.model)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                         args=["--disable-gpu", "--no-sandbox", "--disable-background-networking"])
            try:
                page = new_tab(browser)
                for t, s in servers.items():                       # warm-up: pools, caches, the tab's window
                    browser_run(page, s.base, settings, quiet=wait_until_quiet)
                for _ in range(args.repeats):
                    for t, s in servers.items():
                        alone = outside_playwright(client(s.base.replace("http://", "ws://"), 0, api))
                        runs[t]["tpot_s"].append(alone["tpot_s"])
                        runs[t]["page"].append(browser_run(page, s.base, settings, quiet=wait_until_quiet))
            finally:
                browser.close()
    finally:
        for s in servers.values():
            s.stop()
    rows = {}
    for t, r in runs.items():
        step_ms = statistics.median(x for x in r["tpot_s"] if x) * 1e3
        gaps = pcts([g for x in r["page"] for g in x["token_gaps_ms"]])
        p99 = gaps["p99"]
        rows[t] = {"step_ms": step_ms, "page_tokens_per_s": statistics.median(x["tokens_per_s"] for x in r["page"]),
                   "gaps": gaps["n"], "median_gap_ms": gaps["p50"], "p99_gap_ms": p99, "max_gap_ms": gaps.get("max"),
                   "p99_over_step": p99 / step_ms if p99 else None,
                   "chromium_cpu": sum(x["chromium_cpu_s"] for x in r["page"]) / sum(x["wall_s"] for x in r["page"]),
                   "long_tasks": sum(x["long_tasks"] for x in r["page"])}
    top = counts[-1]
    out = {"settings": settings, "repeats": args.repeats, "rows": rows}
    if top > 1:
        out["targets"] = {"more tokens/s than 1 thread (1% or more)":
                          rows[top]["page_tokens_per_s"] >= 1.01 * rows[1]["page_tokens_per_s"],
                          **{f"p99 gap <= {GOAL_GAP}x the step at {t} thread{'s' if t > 1 else ''}":
                             (rows[t]["p99_over_step"] or 99) <= GOAL_GAP for t in counts}}
    return out


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"The page on {s['model']} (plain decoding, chat, {s['max_tokens']} tokens, full speed) in headless "
             f"Chromium on the same machine, a server per thread count, {r['repeats']} repeats in turn. Step: TPOT "
             "of an /api/ws client alone; gaps: between new tokens appearing in the page, pooled over the repeats; "
             "Chromium's cores: its CPU seconds (every process, load and run) per second of the runs.", "",
             "| threads | engine step ms | page tok/s | gaps | median gap ms | p99 gap ms (÷ step) | longest gap ms "
             "| Chromium's cores | long tasks |", "|---|---|---|---|---|---|---|---|---|"]
    for t, x in r["rows"].items():
        ratio = f" ({x['p99_over_step']:.2f}x)" if x["p99_over_step"] else ""
        lines.append(f"| {t} | {x['step_ms']:.1f} | {x['page_tokens_per_s']:.1f} | {x['gaps']} | "
                     f"{_f(x['median_gap_ms'])} | {_f(x['p99_gap_ms'])}{ratio} | {_f(x['max_gap_ms'])} | "
                     f"{x['chromium_cpu']:.2f} | {x['long_tasks']} |")
    for what, met in r.get("targets", {}).items():
        lines.append(f"\n{what}: {'yes' if met else '**no**'}")
    return "\n".join(lines)
