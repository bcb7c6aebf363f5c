"""`bench serve`'s results as the Markdown of docs/benchmarks.md (section `bench serve`)."""
from __future__ import annotations

import json


def ms(x):
    return None if x is None else x * 1e3


def _f(x, fmt="{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def main_markdown(r: dict) -> str:
    a, c, s = r["alone"], r["concurrent"], r["settings"]
    targets = []
    lines = [f"{r['machine']['date']}, {r['machine']['cpus']} cores, 1-minute load {r['machine']['loadavg_1m']} at "
             f"the end of the run; settings {json.dumps(s)}, full speed, `/api/ws`; {c['repeats']} interleaved repeats "
             f"({a['repeats']} runs alone; tokens/s: the median; latencies: all runs pooled).", "",
             "| | clients | errors | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | TPOT (ms) |",
             "|---|---|---|---|---|---|---|"]
    for label, x in (("one alone", a), (f"{c['clients']} at once", c)):
        lines.append(f"| {label} | {x['clients']} | {x['errors']} | {_f(x['tokens_per_s'])} | "
                     f"{_f(ms(x['ttft_s']['p50']))} / {_f(ms(x['ttft_s']['p99']))} | "
                     f"{_f(ms(x['itl_s']['p50']))} / {_f(ms(x['itl_s']['p99']))} | {_f(ms(x['tpot_s']))} |")
    ratio = r.get("ratio_to_alone")
    targets.append(f"aggregate tokens/s = {_f(ratio, '{:.2f}')}x one alone (target >= 2x)")
    targets.append(f"p99 ITL {_f(ms(c['itl_s']['p99']))} ms (target <= 250 ms)")
    targets.append(f"{c['errors']} errors (target 0)")
    targets.append(f"KV blocks in use after every client left: {r['after_all_left']['kv_blocks_used']} (target 0)")
    lines += [""] + [f"- {t}" for t in targets]
    if "watch" in r:
        w = r["watch"]
        lag = w["lag_after_presenter_done_s"]
        lines.append(f"- {w['watchers']} watchers of one session on `/watch/{{id}}/ws`: {w['connected']} connected, "
                     f"{w['errors']} errors (target 0); they saw `done` {_f(ms(lag['p50']))} ms (p50) / "
                     f"{_f(ms(lag['p99']))} ms (p99) after the presenter; blocks in use after: "
                     f"{r['after_watchers_left']['kv_blocks_used']}")
    lines.append("- TTFT: `start` sent -> first output token received; ITL: gaps between the arrivals of one client's "
                 "rounds (a round ends with its `metrics`; with speculation it brings several tokens); TPOT: "
                 "(done - first token) / (output tokens - 1); all on the client's clock.")
    g = r.get("engine_alone")
    if g:
        lines.append(f"- the engine alone (engine/serving/scheduler.py's `Scheduler` in a loop in the bench's process, no server, "
                     f"same prompts, settings and interleaving): one session {_f(g['alone_tokens_per_s'])} tok/s, "
                     f"{c['clients']} at once {_f(g['concurrent_tokens_per_s'])} tok/s = {_f(g['ratio'], '{:.2f}')}x; "
                     f"the server reaches {_f(100 * a['tokens_per_s'] / g['alone_tokens_per_s'], '{:.0f}')}% and "
                     f"{_f(100 * c['tokens_per_s'] / g['concurrent_tokens_per_s'], '{:.0f}')}% of them")
    e = r.get("server", {})
    if e.get("batches"):
        lines.append(f"- engine thread: {e['batches']} batched computations served {e['batched_requests']} forward "
                     f"requests ({e['batched_requests'] / e['batches']:.1f} per batch)")
    if c["error_messages"]:
        lines.append(f"- errors seen: {'; '.join(c['error_messages'])}")
    return "\n".join(lines)


def sweep_markdown(r: dict) -> str:
    lines = [f"`bench serve --sweep`, {r['machine']['date']}, {r['machine']['cpus']} cores, 1-minute load "
             f"{r['machine']['loadavg_1m']} at the end; {r['max_tokens']} output tokens per client, full speed, "
             f"{r['repeats']} repeats per cell (tokens/s: the median). "
             "Ratio: output tokens/s over no speculation at the same concurrency. ITL is per round (a round "
             "brings 1 token without speculation, up to γ + 1 with it); TPOT per token.", "",
             "| γ | concurrency | TPOT (ms) | ITL p50 / p99 (ms) | output tok/s | mean acceptance length | ratio "
             "| errors |",
             "|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['gamma']} | {row['concurrency']} | {_f(row['tpot_ms'])} | {_f(row['itl_p50_ms'])} / "
                     f"{_f(row['itl_p99_ms'])} | {_f(row['tokens_per_s'])} | "
                     f"{_f(row['mean_acceptance_length'], '{:.2f}')} | {_f(row['ratio'], '{:.2f}')} | "
                     f"{row['errors']} |")
    lines.append(f"\nKV blocks in use after the sweep: {r['kv_blocks_used_after']}.")
    return "\n".join(lines)
