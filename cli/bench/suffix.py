"""`decoding-playground bench suffix`: suffix decoding on a workshop's questions (engine/experiments/workshop.py),
one session at a time, against plain decoding and n-gram lookup, on a real server's /api/ws as a page drives it.

One warm server runs every method (a fresh one would leave its first runs cold). Each question of each round still
gets an empty global tree at its first asking: requests share a tree only with requests of the same tree shape, and
it gets a `suffix_decoding_max_cached_requests` of its own, just under vLLM's 10,000 (far above the three answers
the tree will hold)."""
from __future__ import annotations

import asyncio

from cli.bench.lib import add_bench, goals, shown, table
from cli.bench.served import Server, client, wait_until_loaded
from cli.bench.smollm2 import NAME, NGRAM
from engine.experiments.workshop import DRAFTING, METHODS, PHASES, QUESTIONS, prompt_of, run_order, workshop_figures
from engine.spec_decode.schedule import SCHEDULES

MAX_CACHED_REQUESTS = 10_000          # vLLM's default; the trees of the questions and rounds count down from it


def settings_of(method: str, max_tokens: int, tree: int, schedule: str | None = None) -> dict:
    """Greedy, SmolLM2 with its chat template; every run computes its whole prompt (no prefix-cache hits). Suffix
    decoding with its γ schedule (None: the server's default for it)."""
    base = {"model": NAME, "chat": True, "temperature": 0, "max_tokens": max_tokens, "enable_prefix_caching": False}
    suffix = {**base, "method": "suffix", "suffix_decoding_max_cached_requests": tree,
              **({"num_speculative_tokens_schedule": schedule} if schedule else {})}
    return {"plain": {**base, "method": "none"}, "ngram": {**base, **NGRAM}, "suffix": suffix}[method]


def one_run(ws_base: str, prompt: str, settings: dict) -> dict:
    """One generation: its decode tokens/s by the engine's own clock (1 / TPOT, as `done` says), drafts and text."""
    r = asyncio.run(client(ws_base, 0, settings, prompt=prompt))
    if not r["ok"]:
        raise RuntimeError(f"{settings['method']} on {prompt!r}: {r['error']}")
    s = r["summary"]
    return {"tokens_per_s": 1 / s["tpot_s"] if s.get("tpot_s") else None, "num_drafts": s["num_drafts"] or 0,
            "num_accepted_tokens": s["num_accepted_tokens"] or 0, "text": s["text"]}


def measure(args) -> dict:
    questions = QUESTIONS[:2 if args.quick else args.questions]
    rounds, max_tokens = (1, 48) if args.quick else (args.rounds, args.max_tokens)
    with Server("--no-llamacpp", "--suffix-cache", "shared", models_dir=args.models_dir) as srv:
        wait_until_loaded(srv.base, NAME)
        for method in METHODS:                       # warm, untimed, in a tree no timed run drafts from
            one_run(srv.ws(""), "Say hello.", settings_of(method, 16, MAX_CACHED_REQUESTS, args.schedule))
        runs = {(r, q, ph, m): one_run(srv.ws(""), prompt_of(questions[q], ph),
                                       settings_of(m, max_tokens, MAX_CACHED_REQUESTS - 1 - r * len(questions) - q,
                                                   args.schedule))
                for r, q, ph, m in run_order(len(questions), rounds)}
    phases = workshop_figures(runs)
    return {"questions": len(questions), "rounds": rounds, "max_tokens": max_tokens, "schedule": args.schedule,
            "phases": phases, "ok": all(p["identical"] for p in phases.values())}


def tables(r: dict) -> list[str]:
    p = r["phases"]
    rows = [[PHASES[ph], *x["tokens_per_s"].values(), *x["mean_acceptance_length"].values(),
             shown(x["suffix_over_plain"]), shown(x["suffix_over_ngram"]), x["identical"]] for ph, x in p.items()]
    return [table(["phase", "plain tok/s", "n-gram tok/s", "suffix tok/s", "n-gram mean acceptance length",
                   "suffix mean acceptance length", "suffix / plain", "suffix / n-gram", "identical text"], rows,
                  f"{NAME}, chat, greedy, up to {r['max_tokens']} tokens, one session at a time, {r['questions']} "
                  f"questions x {r['rounds']} round(s) (pairs), decode tokens/s (1 / TPOT, the engine's clock), "
                  f"n-gram k={NGRAM['num_speculative_tokens']}, suffix at vLLM's defaults"
                  + (f", γ schedule {r['schedule']}" if r.get("schedule") else "")),
            goals([(f"suffix / {over.replace('ngram', 'n-gram')}, {PHASES[ph]}", p[ph][f"suffix_over_{over}"]["median"],
                    ">=", bound, shown(p[ph][f"suffix_over_{over}"]))
                   for ph, over, bound in (("again", "plain", 2), ("again", "ngram", 1.3),
                                           ("paraphrase", "plain", 0.95), ("first", "plain", 0.95))])]


def add_parser(bsub) -> None:
    b = add_bench(bsub, "suffix", "suffix decoding on a workshop's questions asked again, against plain and n-gram",
                  measure, tables, quick="2 questions, 1 round, 48 tokens", models_dir=True)
    b.add_argument("--questions", type=int, choices=range(1, len(QUESTIONS) + 1), default=len(QUESTIONS),
                   metavar=f"1-{len(QUESTIONS)}", help=f"how many of the questions (default {len(QUESTIONS)})")
    b.add_argument("--rounds", type=int, choices=range(1, 21), default=3, metavar="1-20", help="default 3")
    b.add_argument("--max-tokens", type=int, choices=range(2, 513), default=128, metavar="2-512",
                   help="an answer's tokens at most (default 128)")
    b.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="suffix decoding's num_speculative_tokens_schedule (default: the server's for suffix)")
