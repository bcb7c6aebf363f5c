"""The table `bench views` prints and writes into docs/benchmarks.md (cli/bench/views.py)."""
from __future__ import annotations

from cli.bench.views import GOAL_SPEEDUP, GOAL_TOKENS, GOAL_VIEWS, MAX_TOKENS, SHOWN


def shown(s: dict) -> str:
    """'1.31× (1.27–1.36, faster)' for an on-screen speed-up; '–' when the view showed none."""
    if s.get("median") is None:
        return "–"
    spread = f"{s['low']:.2f}–{s['high']:.2f}, " if s.get("low") is not None else ""
    return f"{s['median']:.2f}× ({spread}{s.get('verdict') or '?'})"


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"Command: `{r['command']}` — {r['date']} — {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
             f"BLAS threads {m['blas_threads']}. Load average before {r['load_average']}, after "
             f"{r['load_average_after']}; other busy processes: {', '.join(r['busy_processes']) or 'none'}.", "",
             f"Every side {MAX_TOKENS} tokens, greedy. Speed-ups are plain decoding's engine time per token over the "
             "method's: generate's from fresh `generate --json` processes, plain and the method interleaved "
             f"(ABBA, {r['repeats']} rounds), the median with its spread and the verdict of "
             "engine/experiments/compare.py; each view's as it shows it (its own comparison: 3 to 15 interleaved rounds "
             "on the server's engine thread). The Cost card's predicted speed-up is a formula (labelled so on the "
             "page) and not held to the goal.", "",
             "| case | generate | " + " | ".join(label for _, label in SHOWN) + " | Cost card (predicted) | "
             "engine time, Theory / Cost view open ÷ closed (first run, curve pending) | page ÷ generate engine "
             "tokens/s |",
             "|---|---|" + "---|" * len(SHOWN) + "---|---|---|"]
    for c in r["cases"]:
        g = c["generate"]
        page_vs = c["page_tokens_per_s"] / g["tokens_per_s"]
        predicted = f"{c['cost_predicted']:.2f}×" if c["cost_predicted"] else "–"
        lines.append(f"| {c['case']} | {shown(g['speedup'])} | " + " | ".join(shown(c[k]) for k, _ in SHOWN)
                     + f" | {predicted} |")
        lines[-1] += (f" {c['views_open']['theory']:.2f} / {c['views_open']['cost']:.2f} "
                      f"({c['first_run_vs_closed']:.2f}) | {c['page_tokens_per_s']:.0f} ÷ {g['tokens_per_s']:.0f} "
                      f"= {page_vs:.2f} |")
    lines += ["", f"Goals: every measured speed-up on screen within {GOAL_SPEEDUP:.0%} of generate's median and no "
                  f"verdict on the other side of 1 from it; engine time with a view open within {GOAL_VIEWS:.0%} of "
                  f"the views closed; the page's engine tokens/s within {GOAL_TOKENS:.0%} of generate's.", ""]
    for c in r["cases"]:
        missed = [name for name, ok in c["checks"].items() if not ok]
        lines.append(f"- {c['case']}: " + ("all goals met" if not missed else "MISSED: " + "; ".join(missed)))
    return "\n".join(lines)
