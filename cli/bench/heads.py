"""`decoding-playground bench heads`: EAGLE and Medusa heads against plain decoding on SmolLM2, vLLM's acceptance
with our EAGLE head and its steps with our draft model; a full run writes the heads' card and the demo's EAGLE setting.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from cli.bench.engines import chat
from cli.bench.lib import add_bench, generation, goals, machine, machine_line, shown, table, write_section
from cli.bench.smollm2 import NAME, against_plain, config, generate
from app.ws.vllm import EXPORTS
from engine.experiments.draft_crosscheck import crosscheck, crosscheck_table, on_server
from engine.experiments.shootout import SPEC_BENCH, h100_speedup
from engine.external.vllm_rounds import acceptance_figures, own_counts
from engine.external.vllm_server import EAGLE_GAMMA, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, fetched_models, model_dir
from engine.model.shipped_drafts import shipped_drafts
from engine.model.thread_choice import request_threads
from engine.model.threads import threads
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.spec_decode.heads import HEADS_DIR, load_heads
from engine.training.head_prompts import HELD_OUT_PARAGRAPHS, held_out_prompts, summary_prompt

HELD_OUT = held_out_prompts()
OPEN = [HELD_OUT[i] for i in np.random.default_rng(0).permutation(len(HELD_OUT))[:8]]   # head_data's held-out order
SUMMARIES = [summary_prompt(p) for p in HELD_OUT_PARAGRAPHS]
CONFIDENCE = 0.5      # draft_confidence_threshold of the rows that stop early (a held-out sweep chose it: docs)
CONFIGS = [("ngram", 3), *(("eagle", k) for k in (1, 2, 3, 4)), ("eagle", 3, CONFIDENCE), ("eagle", 5, CONFIDENCE),
           *(("medusa", k) for k in (1, 2, 3)), ("medusa", 3, CONFIDENCE)]        # (method, γ[, threshold])
QUICK_CONFIGS = [("eagle", 3), ("medusa", 3)]
EAGLE_SWEEP = [(3, 0.0), (3, 0.5), (5, 0.5), (7, 0.5), (5, 0.3)]   # --compare-threads: (γ or its cap, threshold)
QUICK_SWEEP = [(3, 0.0), (5, 0.5)]
DEMO_FILE = "demo.json"
TIE = 0.01          # speed-ups this close are one run's noise apart


def run(args) -> dict:
    started = machine()
    request_threads(args.threads)                 # the weight products' threads (the default: measured at load)
    fetched = fetched_models()
    reg = ModelRegistry(fetched + shipped_drafts(fetched))       # with the draft model (vLLM's steps with it)
    if NAME not in reg.models:
        raise SystemExit(f"{NAME} is not fetched: run `decoding-playground fetch-model {NAME}` (make fetch)")
    engine = InferenceEngine(reg, max_sessions=2)
    lm = reg.get(NAME)
    heads = reg.heads_for(lm)
    cfgs = [config(*c) for c in (QUICK_CONFIGS if args.quick else CONFIGS) if c[0] == "ngram" or c[0] in heads]
    generate(engine, OPEN[0], 8, method="none")                                           # warm up
    sets = {"open questions": OPEN[:1] if args.quick else OPEN, "summaries": SUMMARIES[:1] if args.quick else SUMMARIES}
    out = {"machine": started, "model": NAME, "max_tokens": args.max_tokens, "repeats": args.repeats, "threads": threads(),
           "sets": {}}
    for label, prompts in sets.items():
        cs = cfgs if label == "open questions" else [c for c in cfgs if c[1]["method"] == "eagle"]
        r = against_plain(engine, prompts, args.max_tokens, args.repeats, cs)[None]
        for row in r["rows"]:
            row["h100_projected"] = h100_speedup(engine, lm, row["method"], row["mean_acceptance_length"],
                                                  row["draft_calls_per_round"], context=256)
        out["sets"][label] = r
    if args.compare_threads and "eagle" in heads:
        counts = sorted({1, max(2, threads())})
        out["by_threads"] = against_plain(engine, sets["open questions"], args.max_tokens, args.repeats, [
            config("eagle", k, q) for k, q in (QUICK_SWEEP if args.quick else EAGLE_SWEEP)], counts)
    held_out = np.array([i for r in out["sets"].values() for i in r.pop("plain_ids")])
    for r in out.get("by_threads", {}).values():
        r.pop("plain_ids")
    out["heads"] = {m: {"parameters": h.num_parameters, "vocab_subset": len(h.subset),
                        "coverage_held_out": float(np.isin(held_out, h.subset).mean())} for m, h in heads.items()}
    if "eagle" in heads and not args.no_vllm:                 # vLLM's acceptance with our head, beside ours
        out["vllm"] = vllm_compare(engine, reg, lm, sets["open questions"], args.max_tokens)
    if reg.draft_for(lm) and not args.no_vllm:                # vLLM's steps with our draft model, beside ours
        out["vllm_draft"] = with_vllm("draft_model", NAME, lambda s: crosscheck(engine, NAME, s, sets["open questions"],
                                                                                args.max_tokens))
    if not args.quick and not args.no_write:
        (HEADS_DIR / NAME / "bench.json").write_text(json.dumps(out, indent=1))
        sets = [set_table(label, r) for label, r in out["sets"].items()]      # the heads' card shows them too
        write_section("heads", "\n\n".join([*sets, machine_line(dict(out["machine"]))]), HEADS_DIR / NAME / "README.md")
        current = current_defaults(HEADS_DIR / NAME)
        best = {t: best_row(r["rows"], current.get(t)) for t, r in out.get("by_threads", {}).items()}
        best[out["threads"]] = best_row(out["sets"]["open questions"]["rows"], current.get(out["threads"]))
        record_defaults(HEADS_DIR / NAME, out["machine"]["date"], best)
    return out


def our_acceptance(engine, name: str, prompts, max_tokens: int, gamma: int) -> dict:
    runs = [generation(engine, prompt, {"model": name, "chat": True, "temperature": 0, "max_tokens": max_tokens,
                                        "method": "eagle", "num_speculative_tokens": gamma,
                                        "enable_prefix_caching": False})[1] for prompt in prompts]
    return acceptance_figures(sum(s["num_drafts"] for s in runs),
                              [sum((s["accepted_per_position"] + [0] * gamma)[i] for s in runs) for i in range(gamma)])


def with_vllm(key: str, name: str, work) -> dict:
    """work(server) on vLLM's `key` server with our drafter exported (app/ws/vllm.py's EXPORTS), stopped after."""
    cache, (export, folder, _) = cache_dir(), EXPORTS[key]
    reason = unavailable_reason(default_venv(cache), model_dir(name, cache))
    return {"skipped": reason} if reason else on_server(VllmServer(
        VARIANTS[key], default_venv(cache), model_dir(name, cache), cache / "vllm",
        draft_dir=export(name, cache / "vllm" / folder / name, cache=cache)), work)


def vllm_acceptance(server, prompts, max_tokens: int) -> dict:
    counts = [own_counts(chat(server, p, max_tokens)["engine_metrics"], EAGLE_GAMMA) for p in prompts]
    if None in counts:
        raise RuntimeError("vLLM sent no per-request figures (--per-request-spec-decode-metrics detailed)")
    return acceptance_figures(sum(c[0] for c in counts), [sum(c[1][i] for c in counts) for i in range(EAGLE_GAMMA)])


def vllm_compare(engine, registry, lm, prompts, max_tokens: int) -> dict:
    """vLLM's mean acceptance length with our EAGLE head (exported) beside ours, greedy, γ = 3."""
    heads = registry.heads_for(lm)
    out = {"gamma": EAGLE_GAMMA, "ours": our_acceptance(engine, lm.name, prompts, max_tokens, EAGLE_GAMMA)}
    shipped, weights = heads["eagle"], load_file(str(HEADS_DIR / lm.name / "eagle.safetensors"))
    weights["vocab_subset"] = np.arange(lm.cfg.vocab_size, dtype=np.int64)       # drafting from every token
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / lm.name).mkdir()
        save_file(weights, str(Path(folder) / lm.name / "eagle.safetensors"))
        heads["eagle"] = load_heads(lm.name, lm.cfg, lm.model.embed, lm.path, Path(folder), lm.model.layout)["eagle"]
    try:
        out["ours, full vocabulary"] = our_acceptance(engine, lm.name, prompts, max_tokens, EAGLE_GAMMA)
    finally:
        heads["eagle"] = shipped
    out["vLLM"] = with_vllm("eagle", lm.name, lambda server: vllm_acceptance(server, prompts, max_tokens))
    return out


def vllm_tables(r: dict) -> list[str]:
    rows = [[label, f"not measured: {x['skipped']}", None] if "skipped" in x else
            [label, x["mean_acceptance_length"], " / ".join(f"{a:.2f}" for a in x["acceptance_per_position"])]
            for label, x in ((k, r[k]) for k in ("ours", "ours, full vocabulary", "vLLM"))]
    return [table(["drafting", "mean acceptance length", "acceptance per position"], rows,
                  f"Our EAGLE head in vLLM (its EAGLE layout), γ = {r['gamma']}, greedy, the same held-out questions")]


def set_table(label: str, r: dict) -> str:
    return table(["config", "mean acceptance length", "acceptance per position", "α", "draft forwards per round", "c",
                  "t(verify)/t(1)", "predicted", "measured, decode", "measured, whole generation", "H100 projection",
                  "identical output"],
                 [[x["config"], x["mean_acceptance_length"], " / ".join(f"{a:.2f}" for a in x["acceptance_per_position"]),
                   x["alpha"], x["draft_calls_per_round"], f"{x['c']:.3f}", x["v"], f"{x['predicted']:.2f}x",
                   shown(x["decode_speedup"]), f"{x['measured_wall']:.2f}x",
                   f"{x['h100_projected']:.2f}x" if x.get("h100_projected") else None, x["identical"]]
                  for x in r["rows"]],
                 f"{label} (plain decoding: {r['t1_ms']:.1f} ms per one-token forward in these runs)")


def threads_tables(r: dict) -> list[str]:
    counts = sorted(r)
    rows = [[row["config"], *(f"{x['mean_acceptance_length']:.2f} / {x['c']:.3f} / {x['v']:.2f} / "
                              f"{shown(x['decode_speedup'])}{'' if x['identical'] else ' (output differs)'}"
                              for x in (r[t]["rows"][i] for t in counts))]
            for i, row in enumerate(r[counts[0]]["rows"])]
    best = [[t, (b := best_row(r[t]["rows"])) and b["config"], b and f"{b['measured']:.2f}x", r[t]["t1_ms"]]
            for t in counts]
    return [table(["config", *(f"{t} thr.: L / c / v / speed-up" for t in counts)], rows,
                  "EAGLE per thread count (open questions, the counts taking turns)"),
            table(["threads", "best setting", "its speed-up", "one-token forward ms"], best)]


def tables(out: dict) -> list[str]:
    heads = table(["head", "parameters", "vocabulary subset (LM head rows)", "coverage of the plain answers"],
                  [[m, f"{h['parameters']:,}", f"{h['vocab_subset']:,}", f"{h['coverage_held_out']:.1%}"]
                   for m, h in out["heads"].items()],
                  f"{out['model']}, chat, temperature 0, {out['threads']} thread(s), {out['max_tokens']} tokens, "
                  f"{out['repeats']} repeats")
    sets = out["sets"]

    def best(label, method):              # the goals' rows: best γ by measured speed-up, identical output required
        rows = [x for x in sets.get(label, {}).get("rows", []) if x["method"] == method]
        return max(rows, key=lambda x: x["measured"] if x["identical"] else 0.0, default=None)
    eagle, summary, medusa = best("open questions", "eagle"), best("summaries", "eagle"), best("open questions", "medusa")
    eagle3 = next((x for x in sets.get("open questions", {}).get("rows", [])
                   if x["method"] == "eagle" and x["gamma"] == 3 and not x.get("confidence")), None)
    every = [x for r in sets.values() for x in r["rows"]]
    error = max((abs(x["measured"] / x["predicted"] - 1) for x in every if x["predicted"]), default=None)
    checks = [("EAGLE at its best γ, open questions, identical output (decode)", eagle, "measured", ">=", 1.5),
              ("EAGLE mean acceptance length at γ = 3, open questions", eagle3, "mean_acceptance_length", ">=", 2.6),
              ("EAGLE at its best γ, summaries (decode)", summary, "measured", ">=", 1.8),
              ("Medusa at its best γ, open questions (decode)", medusa, "measured", ">=", 1.25),
              ("c of EAGLE at its best γ, open questions", eagle, "c", "<=", 0.08)]
    rows = [(what, row[key] if row["identical"] else None, op, bound,
             f"{row[key]:.{3 if key == 'c' else 2}f} ({row['config']}{'' if row['identical'] else ', output differs'})")
            for what, row, key, op, bound in checks if row is not None]
    lines = [heads, *(set_table(label, r) for label, r in sets.items()), goals(rows + (
        [("measured (decode) against predicted, every row, % off", 100 * error, "<=", 10, f"{error:.1%}")]
        if error is not None else []))]
    if "vllm" in out:
        lines += vllm_tables(out["vllm"])
    if "vllm_draft" in out:                    # vLLM's steps with our draft model beside ours
        lines.append(table(*crosscheck_table(out["vllm_draft"])))
    if "by_threads" in out:
        lines += threads_tables(out["by_threads"])
    return lines + [table(["Spec-Bench (Vicuna-7B, A100)", *SPEC_BENCH],
                          [["mean acceptance length", *SPEC_BENCH.values()]])]


def best_row(rows: list[dict], current: dict | None = None) -> dict | None:
    """The fastest EAGLE setting with identical output; the one in use stays unless beaten by more than TIE."""
    eagle = [x for x in rows if x["method"] == "eagle" and x["identical"]]
    best = max(eagle, key=lambda x: x["measured"], default=None)
    kept = [x for x in eagle if current and (x["gamma"], x.get("confidence", 0.0)) ==
            (current["num_speculative_tokens"], current["draft_confidence_threshold"])]
    if best and kept and kept[0]["measured"] * (1 + TIE) >= best["measured"]:
        return kept[0]
    return best


def current_defaults(folder: Path) -> dict[int, dict]:
    """The demo's settings per thread count as last recorded (`record_defaults`)."""
    f = folder / DEMO_FILE
    return {int(t): e for t, e in json.loads(f.read_text())["by_threads"].items()} if f.is_file() else {}


def record_defaults(folder: Path, date: str, best_by_threads: dict[int, dict]) -> dict:
    """Store the best EAGLE setting per thread count in `folder`/demo.json (what the page's demo opens with)."""
    f = folder / DEMO_FILE
    data = json.loads(f.read_text()) if f.is_file() else {"by_threads": {}}
    for t, row in best_by_threads.items():
        if row is None:
            continue
        data["by_threads"][str(t)] = {
            "num_speculative_tokens": row["gamma"], "draft_confidence_threshold": row.get("confidence", 0.0),
            "decode_speedup": round(row["measured"], 3), "measured": f"bench heads, {date}, {row['config']}"}
    f.write_text(json.dumps(data, indent=1) + "\n")
    return data


def add_parser(bsub) -> None:
    b = add_bench(bsub, "heads", "SmolLM2: EAGLE and Medusa heads against plain decoding (fresh generations)", run,
                  tables, quick="one prompt per set, eagle and medusa at γ = 3 only")
    b.add_argument("--max-tokens", type=int, default=96)
    b.add_argument("--repeats", type=int, default=2)
    b.add_argument("--no-vllm", action="store_true",
                   help="leave out vLLM with our EAGLE head and our draft model (each starts a vLLM server: 3.6 GB)")
    b.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads for the weight products (default: measured at load, as serve does)")
    b.add_argument("--compare-threads", action="store_true",
                   help="also sweep EAGLE's γ and threshold at 1 and N threads, taking turns (the demo's defaults "
                        "per thread count)")
