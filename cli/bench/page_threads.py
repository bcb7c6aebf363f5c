"""`bench page --model smollm2-135m`: the page on SmolLM2 in Chromium on the same machine, 1 against N threads.

A server per thread count (`serve --threads T`, as users run it) and one headless Chromium tab (cli/bench/page.py's
runs: the page loaded with autoplay at full speed, reloaded per run once Chromium is quiet). Per repeat, every
count in turn: first a plain /api/ws client alone (no browser: the engine's step, its TPOT), then the page. While
the page streams, the server's own inter-token histogram (/metrics `vllm:inter_token_latency_seconds`: a round,
boundary to its last event, pacing left out) gives the gaps the engine made with the browser beside it; its p99
is read off the buckets (the bound of the first bucket holding 99% of the rounds).

Targets (issue 33): with N threads the page gets more tokens/s than with 1, at a p99 inter-token gap no worse
than 1.5x the engine's step at N threads.
"""
from __future__ import annotations

import asyncio
import re
import statistics
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from cli.bench.serve_report import _f, ms

GOAL_GAP = 1.5
ITL = re.compile(r'^vllm:inter_token_latency_seconds_bucket\{le="([^"]+)",model_name="([^"]+)"\} ([0-9.e+]+)$', re.M)


def itl_buckets(base: str, model: str) -> dict[float, float]:
    """The server's cumulative inter-token histogram of `model`: upper bound -> rounds so far."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for le, name, count in ITL.findall(text):
        if name == model:
            out[float("inf") if le == "+Inf" else float(le)] = float(count)
    return out


def p99_bound(before: dict, after: dict) -> float | None:
    """The smallest bucket bound holding >= 99% of the rounds observed between two readings."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return min(le for le, n in delta.items() if n >= 0.99 * total)


def outside_playwright(coro):
    """Run a coroutine to its end from code that Playwright's sync API runs (its event loop holds this thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def run_page_threads(args) -> dict:
    from playwright.sync_api import sync_playwright

    from cli.bench.browser import CHROMIUM, browser_run, new_tab, wait_until_quiet
    from cli.bench.serve_clients import client
    from cli.bench.serve_threads import wait_until_loaded
    from cli.bench.served import Server

    counts = sorted({1, max(1, args.threads)})
    settings = {"model": args.model, "method": "none", "chat": "true", "max_tokens": args.max_tokens}
    api = {"model": args.model, "method": "none", "chat": True, "max_tokens": args.max_tokens}
    if not CHROMIUM.exists():
        raise SystemExit(f"bench page needs Chromium at {CHROMIUM} (make browser)")
    runs = {t: {"tpot_s": [], "page": [], "p99_s": []} for t in counts}
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
                        before = itl_buckets(s.base, args.model)
                        runs[t]["page"].append(browser_run(page, s.base, settings, quiet=wait_until_quiet))
                        runs[t]["p99_s"].append(p99_bound(before, itl_buckets(s.base, args.model)))
            finally:
                browser.close()
    finally:
        for s in servers.values():
            s.stop()
    rows = {}
    for t, r in runs.items():
        step = statistics.median(x for x in r["tpot_s"] if x)
        p99 = max((x for x in r["p99_s"] if x is not None), default=None)
        rows[t] = {"step_ms": step * 1e3, "page_tokens_per_s": statistics.median(x["tokens_per_s"] for x in r["page"]),
                   "p99_gap_ms": ms(p99), "p99_over_step": p99 / step if p99 else None,
                   "long_tasks": sum(x["long_tasks"] for x in r["page"])}
    top = counts[-1]
    out = {"settings": settings, "repeats": args.repeats, "rows": rows}
    if top > 1:
        out["targets"] = {"more tokens/s than 1 thread": rows[top]["page_tokens_per_s"] > rows[1]["page_tokens_per_s"],
                          f"p99 gap <= {GOAL_GAP}x the step": (rows[top]["p99_over_step"] or 99) <= GOAL_GAP}
    return out


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"The page on {s['model']} (plain decoding, chat, {s['max_tokens']} tokens, full speed) in headless "
             f"Chromium on the same machine, a server per thread count, {r['repeats']} repeats in turn. Step: TPOT "
             "of an /api/ws client alone; gap: p99 of the server's inter-token histogram while the page streamed "
             "(a bucket bound, the worst run).", "",
             "| threads | engine step ms | page tok/s | p99 gap ms (÷ step) | long tasks |", "|---|---|---|---|---|"]
    for t, x in r["rows"].items():
        ratio = f" ({x['p99_over_step']:.2f}x)" if x["p99_over_step"] else ""
        lines.append(f"| {t} | {x['step_ms']:.1f} | {x['page_tokens_per_s']:.1f} | {_f(x['p99_gap_ms'])}{ratio} | "
                     f"{x['long_tasks']} |")
    for what, met in r.get("targets", {}).items():
        lines.append(f"\n{what}: {'yes' if met else '**no**'}")
    return "\n".join(lines)
