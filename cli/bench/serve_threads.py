"""`bench serve --model NAME`: the workshop room on one model, 1, 4 and 16 sessions at 1 .. N threads.

One real server per thread count (`serve --threads T`, all started at once so that the counts can take turns),
the same websocket clients as the rest of `bench serve` (/api/ws, full speed, plain decoding, chat template):
per thread count and number of sessions, aggregate output tokens/s, TTFT and ITL p50 / p99 (the gaps between
rounds: at full speed a round is one decode step of the batch). Within each repeat every concurrency runs on
every server in turn. The scheduler batches the sessions' decode steps into one forward (engine/serving/
scheduler.py): each weight is read once for all of them, so tokens/s grows with the sessions until the
batched products stop being bound by memory and start being bound by arithmetic: the knee, said per thread
count (where one more step of sessions gains less than KNEE_GAIN).
"""
from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack

from cli.bench.serve_clients import machine, many, merge
from cli.bench.serve_report import _f, ms
from cli.bench.served import Server, get_json

ROOM = (1, 4, 16)
KNEE_GAIN = 1.25       # tokens/s from one concurrency to the next (4x the sessions) below this: past the knee
MAX_TOKENS = 64


def run_room(args) -> dict:

    counts = list(range(1, max(1, args.threads) + 1))
    settings = {"model": args.model, "method": "none", "chat": True, "max_tokens": args.max_tokens or MAX_TOKENS}
    results: dict = {t: {c: [] for c in ROOM} for t in counts}
    with ExitStack() as stack:
        servers = {t: stack.enter_context(Server("--max-sessions", str(max(ROOM)), "--max-queue", str(max(ROOM)),
                                                 "--threads", str(t), "--no-llamacpp", models_dir=args.models_dir,
                                                 start_timeout_s=120))
                   for t in counts}
        ws = {t: s.base.replace("http://", "ws://") for t, s in servers.items()}
        for s in servers.values():
            wait_until_loaded(s.base, args.model)
        for t in counts:                            # warm up: the KV pools are touched
            asyncio.run(many(ws[t], max(ROOM), settings))
        for _ in range(args.repeats):
            for c in ROOM:
                for t in counts:
                    results[t][c].append(asyncio.run(many(ws[t], c, settings)))
        served = {t: next(m for m in get_json(servers[t].base + "/api/models")["models"]
                          if m["name"] == args.model) for t in counts}
    rows = {t: {c: merge(runs) for c, runs in by.items()} for t, by in results.items()}
    bad = {t: m.get("threads") for t, m in served.items() if m.get("threads", t) != t}
    if bad:
        raise RuntimeError(f"a server ran another thread count than asked: {bad}")
    return {"settings": settings, "machine": machine(), "repeats": args.repeats, "rows": rows,
            "knee": {t: knee(rows[t]) for t in counts}}


def wait_until_loaded(base: str, model: str, timeout_s: float = 300.0) -> None:
    """Until the server's start-up has loaded `model` (/api/models: loading false). Sessions started on a
    fetched model while its server still loads it in the background each took gigabytes here (several
    servers were killed for memory): the room starts once the model is in."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = {m["name"]: m for m in get_json(base + "/api/models")["models"]}
        if model not in models:
            raise SystemExit(f"bench serve: the server offers no model {model!r}: {', '.join(models)}")
        if not models[model].get("loading"):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model} did not load within {timeout_s:.0f} s")
        time.sleep(0.2)


def knee(by_concurrency: dict) -> dict:
    """Where the room's tokens/s stops growing with the sessions: the gain of each step of concurrency, and the
    last concurrency reached before the gain fell below KNEE_GAIN (None: it never did up to the largest)."""
    cs = sorted(by_concurrency)
    tps = {c: by_concurrency[c]["tokens_per_s"] for c in cs}
    gains = {f"{a}->{b}": tps[b] / tps[a] for a, b in zip(cs, cs[1:]) if tps[a] and tps[b]}
    at = next((a for a, b in zip(cs, cs[1:]) if tps[a] and tps[b] and tps[b] / tps[a] < KNEE_GAIN), None)
    return {"gains": gains, "at": at}


def room_markdown(r: dict) -> str:
    s, m = r["settings"], r["machine"]
    lines = [f"{m['date']}, {m['cpus']} cores, 1-minute load {m['loadavg_1m']} at the end of the run: the room on "
             f"{s['model']} (plain decoding, chat template, {s['max_tokens']} tokens, full speed, /api/ws), a server "
             f"per thread count (`serve --threads T`), {r['repeats']} repeats, every concurrency on every server in "
             "turn (tokens/s: the median; latencies pooled).", "",
             "| threads | sessions | errors | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) |",
             "|---|---|---|---|---|---|"]
    for t, by in r["rows"].items():
        for c, x in by.items():
            lines.append(f"| {t} | {c} | {x['errors']} | {_f(x['tokens_per_s'])} | "
                         f"{_f(ms(x['ttft_s']['p50']))} / {_f(ms(x['ttft_s']['p99']))} | "
                         f"{_f(ms(x['itl_s']['p50']))} / {_f(ms(x['itl_s']['p99']))} |")
    lines.append("")
    for t, k in r["knee"].items():
        gains = ", ".join(f"{step} sessions {g:.2f}x" for step, g in k["gains"].items())
        where = (f"the knee at {k['at']} sessions (beyond it 4x the sessions gain less than {KNEE_GAIN}x)"
                 if k["at"] else f"no knee up to {max(ROOM)} sessions (every 4x gained at least {KNEE_GAIN}x)")
        lines.append(f"{t} thread{'s' * (t > 1)}: tokens/s {gains}; {where}.")
    ts = sorted(r["rows"])
    if len(ts) > 1:
        a, b = ts[0], ts[-1]
        ratios = [(c, r["rows"][b][c]["tokens_per_s"], r["rows"][a][c]["tokens_per_s"]) for c in ROOM]
        lines.append(f"{b} threads against {a}, tokens/s: " + ", ".join(
            f"{c} session{'s' * (c > 1)} {x / y:.2f}x" for c, x, y in ratios if x and y) + ".")
    return "\n".join(lines)
