"""`decoding-playground bench views`: every speed-up the page shows, through a real server and Chromium, beside
`generate`'s for the same settings, in three cases (docs/benchmarks.md).
"""
from __future__ import annotations

import json
import statistics
import urllib.parse
import urllib.request

from cli.bench.browser import PROMPT, chromium_tab, load_until_done
from cli.bench.lib import add_bench, generate_process, paired, shown, table, take_turns
from cli.bench.served import Server
from cli.bench.smollm2 import SUMMARY_PROMPT
from engine.model.thread_choice import available_cores, candidate_threads

MAX_TOKENS = 64                  # the Shoot-out's cap: every view runs the same settings
DEMO_MODEL, DEMO_PROMPT = "smollm2-135m", "Explain how a rainbow forms, in a short paragraph."  # app/views/page.py
CASES = [  # (label, settings, prompt): the non-demo model first, so that its curve is asked for during a run
    ("target-mha + draft model", {"model": "target-mha", "method": "draft_model", "num_speculative_tokens": 4},
     PROMPT),
    ("SmolLM2 + EAGLE (the demo)", {"model": DEMO_MODEL, "chat": "true", "method": "eagle",
                                    "num_speculative_tokens": 5, "draft_confidence_threshold": 0.5}, DEMO_PROMPT),
    ("SmolLM2 + n-gram, a summary", {"model": DEMO_MODEL, "chat": "true", "method": "ngram",
                                     "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
     SUMMARY_PROMPT),
]
GOAL_SPEEDUP, GOAL_VIEWS, GOAL_TOKENS = 0.15, 0.10, 0.15
TIMEOUT_MS = 900_000


# --- generate ---------------------------------------------------------------------------------------------------
def generate_comparison(prompt: str, settings: dict, repeats: int, models_dir, threads: int) -> dict:
    """`generate --json --threads T` processes with the case's method and without, taking turns."""
    def run(s: dict) -> dict:
        r = generate_process(prompt, {"max_tokens": MAX_TOKENS, "threads": threads, **s}, models_dir)
        return {"ms_per_token": r["elapsed_s"] * 1e3 / r["num_output_tokens"], "tokens_per_s": r["tokens_per_s"],
                "tokens": r["num_output_tokens"], "text": r["text"]}
    run(settings)                                                 # untimed: the weights in the OS's page cache
    runs = take_turns({"plain": lambda: run({**settings, "method": "none"}), "method": lambda: run(settings)}, repeats)
    return {"speedup": paired(*([r["ms_per_token"] for r in v] for v in runs.values())),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs["method"]),
            "plain_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs["plain"]),
            "same_text": runs["plain"][0]["text"] == runs["method"][0]["text"], "runs": runs}


def curve(base: str, model: str) -> dict:
    """The server's verify curve of a model, waiting for its measurement."""
    with urllib.request.urlopen(f"{base}/teach/curve.json?model={model}", timeout=TIMEOUT_MS / 1e3) as r:
        return json.loads(r.read())


# --- the page ---------------------------------------------------------------------------------------------------
def page_url(base: str, prompt: str, settings: dict, **extra) -> str:
    """The page with the case's settings, the prefix cache off (as in a fresh `generate`)."""
    query = {"speed": "max", "prompt": prompt, "max_tokens": MAX_TOKENS, **settings, "enable_prefix_caching": "false",
             **extra}
    return f"{base}/?{urllib.parse.urlencode({k: str(v) for k, v in query.items()})}"


def page_run(page, url: str) -> dict:
    """The page loaded with autoplay: its run's engine tokens/s from the summary line."""
    load_until_done(page, url, TIMEOUT_MS / 1e3)
    elapsed_s, tokens = page.get_attribute("#summary", "data-elapsed-s"), page.get_attribute("#summary", "data-tokens")
    if not elapsed_s or not tokens:
        raise RuntimeError(f"no engine time in the page's summary: {page.inner_text('#summary')[:200]!r}")
    ms = float(elapsed_s) * 1e3 / int(tokens)            # the summary line's figures, unrounded
    return {"tokens_per_s": 1e3 / ms, "ms_per_token": ms, "text": page.inner_text("#summary")}


def figures(page, button: str, selector: str) -> dict:
    """Press `button` and wait for the on-screen speed-up at `selector`: its median, spread and verdict (the data
    attributes beside its text)."""
    page.click(button)
    page.wait_for_selector(selector, state="attached", timeout=TIMEOUT_MS)
    el = page.locator(selector).first
    value = {k: el.get_attribute(f"data-{k}") for k in ("median", "speedup", "low", "high", "verdict", "speed-verdict")}
    num = {k: float(v) if v not in (None, "", "None") else None for k, v in value.items() if "verdict" not in k}
    return {"median": num["median"] if num["median"] is not None else num["speedup"], "low": num["low"],
            "high": num["high"], "verdict": value["verdict"] or value["speed-verdict"], "text": el.inner_text()}


def theory_measure(page) -> dict:
    return {**figures(page, "#theory-measure", "#theory-measured[data-verdict]"),
            "note": page.inner_text("#theory-measured-note")}


def views_case(page, base: str, label: str, settings: dict, prompt: str, repeats: int) -> dict:
    method = settings["method"]
    r = {}
    # the Theory view open from the start (this model's curve, unless measured already, is asked for meanwhile)
    r["theory_first_run"] = page_run(page, page_url(base, prompt, settings, autoplay=1, view="theory"))
    r["theory_from_start"] = theory_measure(page)
    curve(base, settings["model"])                                         # measured by now (or now)
    page_run(page, page_url(base, prompt, settings, autoplay=1))           # warm
    runs = take_turns({view: lambda v=view: page_run(page, page_url(base, prompt, settings, autoplay=1,
                                                                   **({"view": v} if v != "closed" else {})))
                       for view in ("closed", "theory", "cost")}, repeats)
    r["page_runs"] = runs
    r["views_open"] = {view: statistics.median(o["ms_per_token"] / c["ms_per_token"] for o, c in zip(runs[view],
                                                                                                   runs["closed"]))
                       for view in ("theory", "cost")}
    r["page_tokens_per_s"] = statistics.median(x["tokens_per_s"] for x in runs["closed"])
    r["first_run_vs_closed"] = r["theory_first_run"]["ms_per_token"] / statistics.median(
        x["ms_per_token"] for x in runs["closed"])
    # the Theory view opened after a run with the views closed, then the Cost card
    page_run(page, page_url(base, prompt, settings, autoplay=1))
    page.click("#tab-theory")
    r["theory_after"] = theory_measure(page)
    r["cost_measured"] = figures(page, "#tab-cost", "#cost-body [data-figure=speedup_measured]")
    predicted = page.get_attribute("#cost-body [data-figure=speedup_run_predicted]", "data-value")
    r["cost_predicted"] = float(predicted) if predicted else None
    # the Race and the Shoot-out
    page.goto(page_url(base, prompt, settings, view="race", race="method", race_a="none", race_b=method))
    r["race"] = figures(page, "#race-start", "#race-result [data-speed-verdict]")
    page.goto(page_url(base, prompt, settings, view="shootout"))
    row = f"#shootout-result tr[data-method='{method}'] td[data-figure=measured]"
    r["shootout"] = figures(page, "#shootout-start", row)
    r["shootout"]["verdict"] = page.get_attribute(f"{row} strong", "data-verdict") if r["shootout"]["median"] else None
    return r


def run_views(models_dir, repeats: int, cases: list, threads: int) -> dict:
    out = [{"case": label, "settings": settings, "prompt": prompt,
            "generate": generate_comparison(prompt, settings, repeats, models_dir, threads)}
           for label, settings, prompt in cases]
    with Server("--max-sessions", "4", "--threads", str(threads), models_dir=models_dir) as srv, \
            chromium_tab("views") as page:
        if any(settings["model"] == DEMO_MODEL for _, settings, _ in cases):
            curve(srv.base, DEMO_MODEL)                # the start-up measurement (the demo's) is done first
        for case in out:
            case.update(views_case(page, srv.base, case["case"], case["settings"], case["prompt"], repeats))
    for case in out:
        case["checks"] = checks(case)
    return {"repeats": repeats, "threads": threads, "cases": out,
            "ok": all(all(c["checks"].values()) for c in out)}


SHOWN = (("race", "Race"), ("shootout", "Shoot-out"), ("theory_from_start", "Theory, open from the start"),
         ("theory_after", "Theory, opened after"), ("cost_measured", "Cost card (measured)"))


def checks(case: dict) -> dict:
    """The goals, per case: speed-ups on screen against generate's, views open against closed."""
    g = case["generate"]["speedup"]["median"]
    out = {}
    for key, _ in SHOWN:
        shown = case[key]
        out[f"{key} within {GOAL_SPEEDUP:.0%}"] = (shown["median"] is not None
                                                   and abs(shown["median"] / g - 1) <= GOAL_SPEEDUP)
        out[f"{key} verdict not the other way"] = not ((shown["verdict"] == "faster" and g < 1)
                                                       or (shown["verdict"] == "slower" and g > 1))
    for view, ratio in case["views_open"].items():
        out[f"{view} view open within {GOAL_VIEWS:.0%}"] = abs(ratio - 1) <= GOAL_VIEWS
    out[f"page tokens/s within {GOAL_TOKENS:.0%}"] = abs(case["page_tokens_per_s"] / case["generate"]["tokens_per_s"]
                                                         - 1) <= GOAL_TOKENS
    return out


def tables(r: dict) -> list[str]:
    rows = []
    for c in r["cases"]:
        g = c["generate"]
        rows.append([c["case"], shown(g["speedup"]), *(shown(c[k]) for k, _ in SHOWN),
                     f"{c['cost_predicted']:.2f}x" if c["cost_predicted"] else None,
                     f"{c['views_open']['theory']:.2f} / {c['views_open']['cost']:.2f} ({c['first_run_vs_closed']:.2f})",
                     f"{c['page_tokens_per_s']:.0f} ÷ {g['tokens_per_s']:.0f} = "
                     f"{c['page_tokens_per_s'] / g['tokens_per_s']:.2f}"])
    goals = [[c["case"], "; ".join(name for name, ok in c["checks"].items() if not ok) or "none",
              all(c["checks"].values())] for c in r["cases"]]
    return [table(["case", "generate", *(label for _, label in SHOWN), "Cost card (predicted)",
                   "engine time, Theory / Cost view open ÷ closed (first run, curve pending)",
                   "page ÷ generate engine tokens/s"], rows,
                  f"{MAX_TOKENS} tokens, greedy, {r['repeats']} rounds, {r['threads']} thread(s) for SmolLM2's products"),
            table(["case", "goals missed", "all met"], goals)]


def measure(args) -> dict:
    cases = [CASES[int(i)] for i in args.case] if args.case else CASES
    threads = args.threads or candidate_threads(available_cores(), serving=True)
    return run_views(args.models_dir, max(3, args.repeats), cases, threads)


def add_parser(bsub) -> None:
    b = add_bench(bsub, "views", "every on-screen speed-up (Race, Shoot-out, Theory, Cost) in a real browser beside "
                  "generate's; engine time with views open", measure, tables, models_dir=True)
    b.add_argument("--repeats", type=int, default=5, help="rounds of generate and of the page's runs (default 5, at "
                   "least 3; the views' own comparisons run 3 to 15 each)")
    b.add_argument("--case", action="append", choices=[str(i) for i in range(len(CASES))],
                   help="only these cases (0: target-mha, 1: SmolLM2 + EAGLE, 2: n-gram on a summary)")
    b.add_argument("--threads", type=int, default=None, help="threads of SmolLM2's products, for the server and every "
                   "generate alike (default: the most a server's default may take here: one core left free)")
