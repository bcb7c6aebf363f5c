"""`decoding-playground bench heads`: EAGLE and Medusa heads, chains and token trees, against plain decoding on
SmolLM2 in one interleaved run (the trees beside the best chain: engine/experiments/tree_shapes.py), vLLM's
acceptance with our EAGLE head and its steps with our draft model, llama.cpp's acceptance with our draft model; a
full run writes the heads' card and the demo's EAGLE setting, chain or tree.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from app.ws.vllm import EXPORTS
from cli.bench.engines import chat
from cli.bench.lib import add_bench, generation, goals, machine, machine_line, shown, table, write_section
from cli.bench.smollm2 import CONTEXT, NAME, against_plain, config, generate
from engine.experiments.draft_crosscheck import crosscheck, crosscheck_table, on_server
from engine.experiments.measure import verify_curve
from engine.experiments.shootout import SPEC_BENCH, h100_speedup
from engine.external.llamacpp_draft import DRAFT_GAMMA, draft_model_acceptance, pooled_rate
from engine.experiments.tree_shapes import (TREE_SHAPES, best_row, current_defaults, is_tree,
                                            record_defaults, tree_config, tree_configs, tree_goals, tree_rows,
                                            verified_nodes)
from engine.external.vllm_rounds import acceptance_figures, own_counts
from engine.external.vllm_server import EAGLE_GAMMA, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir
from engine.model.thread_choice import request_threads
from engine.model.threads import threads
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.spec_decode.heads import HEADS_DIR, load_heads
from engine.training.head_prompts import HELD_OUT_PARAGRAPHS, held_out_prompts, summary_prompt

HELD_OUT = held_out_prompts()
OPEN = [HELD_OUT[i] for i in np.random.default_rng(0).permutation(len(HELD_OUT))[:8]]   # head_data's held-out order
SUMMARIES = [summary_prompt(p) for p in HELD_OUT_PARAGRAPHS]
CONFIDENCE = 0.5      # draft_confidence_threshold of the rows that stop early (a held-out sweep chose it: docs)
CONFIGS = [("ngram", 3), *(("eagle", k) for k in (2, 3, 4)), ("eagle", 5, CONFIDENCE), ("medusa", 2), ("medusa", 3),
           *(("draft_model", k) for k in (2, 3, 4))]
QUICK_CONFIGS = [("eagle", 3), ("medusa", 3)]                            # chains: (method, γ[, threshold])
EAGLE_SWEEP = [config("eagle", 3), config("eagle", 3, CONFIDENCE), config("eagle", 5, CONFIDENCE),
               *(tree_config("eagle", *shape) for shape in TREE_SHAPES["eagle"][::2])]   # --compare-threads
QUICK_SWEEP = [config("eagle", 3), tree_config("eagle", *TREE_SHAPES["eagle"][0])]


def run(args) -> dict:
    started = machine()
    request_threads(args.threads)                 # the weight products' threads (the default: measured at load)
    reg = ModelRegistry.from_dir()                # SmolLM2 with the draft shipped for it (and our small models)
    if NAME not in reg.models:
        raise SystemExit(f"{NAME} is not fetched: run `decoding-playground fetch-model {NAME}` (make fetch)")
    engine = InferenceEngine(reg, max_sessions=2)
    lm = reg.get(NAME)
    heads = reg.heads_for(lm)
    drafters = {"ngram", *heads, *(["draft_model"] if reg.draft_for(lm) is not None else [])}
    cfgs = [config(*c) for c in (QUICK_CONFIGS if args.quick else CONFIGS) if c[0] in drafters]
    cfgs += tree_configs([m for m in ("eagle", "medusa") if m in heads], args.quick)
    generate(engine, OPEN[0], 8, method="none")                                           # warm up
    curve = verify_curve(lm, CONTEXT, sorted({1, *(verified_nodes(s) + 1 for _, s in cfgs)}), 3 if args.quick else 9)
    sets = {"open questions": OPEN[:1] if args.quick else OPEN, "summaries": SUMMARIES[:1] if args.quick else SUMMARIES}
    out = {"machine": started, "model": NAME, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "threads": threads(), "sets": {}, "verify_curve": {n: ms / curve[1] for n, ms in curve.items()}}
    for label, prompts in sets.items():
        cs = cfgs if label == "open questions" else [c for c in cfgs if c[1]["method"] == "eagle"]
        r = against_plain(engine, prompts, args.max_tokens, args.repeats, cs)[None]
        for row in r["rows"]:
            row["h100_projected"] = h100_speedup(engine, lm, row["method"], row["mean_acceptance_length"],
                                                  row["draft_calls_per_round"], CONTEXT, row["nodes_per_round"])
            row["curve_ratio"] = out["verify_curve"][row["budget"] + 1]
        out["sets"][label] = r
    if args.compare_threads and "eagle" in heads:
        counts = sorted({1, max(2, threads())})
        out["by_threads"] = against_plain(engine, sets["open questions"], args.max_tokens, args.repeats,
                                          QUICK_SWEEP if args.quick else EAGLE_SWEEP, counts)
    held_out = np.array([i for r in out["sets"].values() for i in r.pop("plain_ids")])
    for r in out.get("by_threads", {}).values():
        r.pop("plain_ids")
    out["heads"] = {m: {"parameters": h.num_parameters, "vocab_subset": len(h.subset),
                        "coverage_held_out": float(np.isin(held_out, h.subset).mean())} for m, h in heads.items()}
    if "eagle" in heads and not args.no_vllm:                 # vLLM's acceptance with our head, beside ours
        out["vllm"] = vllm_compare(engine, reg, lm, sets["open questions"], args.max_tokens)
    if reg.draft_for(lm) is not None:                         # llama.cpp's acceptance with our draft model, beside ours
        q, n = sets["open questions"], args.max_tokens
        ours = our_acceptance(engine, NAME, q, n, DRAFT_GAMMA, "draft_model")
        out["draft_model"] = {"gamma": DRAFT_GAMMA, "ours": ours, "llama.cpp": draft_model_acceptance(q, n)}
    out["block"] = (block_against_standard(engine, sets["summaries"], args.max_tokens, 1 if args.quick else 4)
                    if "eagle" in heads else None)
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


def our_acceptance(engine, name: str, prompts, max_tokens: int, gamma: int, method: str = "eagle") -> dict:
    settings = {"model": name, "chat": True, "temperature": 0, "max_tokens": max_tokens, "method": method,
                "num_speculative_tokens": gamma, "enable_prefix_caching": False}
    runs = [generation(engine, prompt, settings)[1] for prompt in prompts]
    per_position = [sum((s["accepted_per_position"] + [0] * gamma)[i] for s in runs) for i in range(gamma)]
    return {**acceptance_figures(sum(s["num_drafts"] for s in runs), per_position),
            **pooled_rate([(s["num_draft_tokens"], s["num_accepted_tokens"]) for s in runs])}


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


def block_against_standard(engine, prompts, max_tokens: int, seeds: int = 4) -> dict:
    """EAGLE γ = 3 at temperature 1, block-verified, each prompt at `seeds` seeds: its mean acceptance length, and
    token-by-token verification's on the same drafts with the same draws (paired: the difference is the rule's,
    not the sampling's); beside them what each rule accepts on average over the draws given the drafts."""
    settings = {"model": NAME, "chat": True, "temperature": 1.0, "max_tokens": max_tokens, "method": "eagle",
                "num_speculative_tokens": 3, "rejection_sample_method": "block"}
    runs = [generation(engine, p, {**settings, "seed": seed})[1]["block_verification"]
            for seed in range(seeds) for p in prompts]
    n = sum(r["num_drafts"] for r in runs)
    gains = [r["mean_acceptance_length"] - r["standard_mean_acceptance_length"] for r in runs]   # per generation
    return {"rounds": n, "counted_gain_se": float(np.std(gains, ddof=1) / np.sqrt(len(gains))) if len(gains) > 1
            else None, **{name: sum(r[k] * r["num_drafts"] for r in runs) / n for name, k in
                          (("block", "mean_acceptance_length"), ("standard", "standard_mean_acceptance_length"),
                           ("block_expected", "expected_mean_acceptance_length"),
                           ("standard_expected", "standard_expected_mean_acceptance_length"))}}


def acceptance_table(r: dict, title: str) -> str:      # engines' acceptance with one drafter (llama.cpp's: drafted)
    rows = [[k, f"not measured: {x['skipped']}"] if "skipped" in x else [k, x.get("mean_acceptance_length"), " / ".join(
        f"{a:.2f}" for a in x.get("acceptance_per_position", [])) or None, x.get("draft_n") and
        f"{x['draft_n_accepted']} / {x['draft_n']} = {x['acceptance_rate']:.3f}"] for k, x in r.items() if k != "gamma"]
    return table(["drafting", "mean acceptance length", "acceptance per position", "accepted / drafted"], rows,
                 f"{title}, γ = {r['gamma']}, greedy, the same held-out questions")


def set_table(label: str, r: dict) -> str:
    trees = {t["config"]: t for t in tree_rows(r["rows"]) if t["chain"]}
    return table(["config", "mean acceptance length", "acceptance per position", "α", "draft forwards per round", "c",
                  "t(verify)/t(1)", "rows: t(n)/t(1), curve", "predicted", "measured, decode",
                  "measured, whole generation", "tree / best chain: speed, L", "H100 projection", "identical output"],
                 [[x["config"], x["mean_acceptance_length"],
                   " / ".join(f"{a:.2f}" for a in x["acceptance_per_position"]), x["alpha"],
                   x["draft_calls_per_round"], f"{x['c']:.3f}", x["v"],
                   x.get("curve_ratio") and f"{x['budget'] + 1}: {x['curve_ratio']:.2f}", f"{x['predicted']:.2f}x",
                   shown(x["decode_speedup"]), f"{x['measured_wall']:.2f}x", (t := trees.get(x["config"])) and
                   f"{t['vs_chain']:.2f}x, L {t['acceptance_vs_chain']:.2f}x ({t['chain']})",
                   f"{x['h100_projected']:.2f}x" if x.get("h100_projected") else None, x["identical"]]
                  for x in r["rows"]],
                 f"{label} (plain decoding: {r['t1_ms']:.1f} ms per one-token forward in these runs)")


def threads_tables(r: dict) -> list[str]:
    counts = sorted(r)
    rows = [[row["config"], *(f"{x['mean_acceptance_length']:.2f} / {x['c']:.3f} / {x['v']:.2f} / "
                              f"{shown(x['decode_speedup'])}{'' if x['identical'] else ' (output differs)'}"
                              for x in (r[t]["rows"][i] for t in counts))]
            for i, row in enumerate(r[counts[0]]["rows"])]
    best = "; ".join(f"at {t} thread(s), {b['config']}, {b['measured']:.2f}x (one-token forward {r[t]['t1_ms']:.1f} ms)"
                     for t in counts if (b := best_row(r[t]["rows"])))
    return [table(["config", *(f"{t} thr.: L / c / v / speed-up" for t in counts)], rows,
                  "EAGLE per thread count (open questions, the counts taking turns)"), f"Best: {best or 'none'}."]


def tables(out: dict) -> list[str]:
    heads = "; ".join(f"{m} {h['parameters']:,} parameters + LM head rows of a {h['vocab_subset']:,}-token subset "
                      f"({h['coverage_held_out']:.1%} of the plain answers' tokens)" for m, h in out["heads"].items())
    sets = out["sets"]

    def best(label, method, chains=False):  # the goals' rows: best setting by measured speed-up, identical output
        rows = [x for x in sets.get(label, {}).get("rows", []) if x["method"] == method and not (chains and is_tree(x))]
        return max(rows, key=lambda x: x["measured"] if x["identical"] else 0.0, default=None)
    eagle, medusa = best("open questions", "eagle"), best("open questions", "medusa")
    summary, draft = best("summaries", "eagle"), best("open questions", "draft_model")
    chain, open_rows = best("open questions", "eagle", chains=True), sets.get("open questions", {}).get("rows", [])
    eagle3 = next((x for x in open_rows if x["method"] == "eagle" and x["gamma"] == 3 and not x.get("confidence")
                   and not is_tree(x)), None)
    draft4 = next((x for x in open_rows if x["method"] == "draft_model" and x["gamma"] == 4 and not is_tree(x)), None)
    draft4 = draft4 and {**draft4, "position_1": draft4["acceptance_per_position"][0]}
    every = [x for r in sets.values() for x in r["rows"]]
    error = max((abs(x["measured"] / x["predicted"] - 1) for x in every if x["predicted"]), default=None)
    checks = [("EAGLE at its best setting, open questions, identical output (decode)", eagle, "measured", ">=", 1.5),
              ("EAGLE mean acceptance length, γ = 3 chain", eagle3, "mean_acceptance_length", ">=", 2.6),
              ("EAGLE at its best setting, summaries (decode)", summary, "measured", ">=", 1.8),
              ("Medusa at its best setting, open questions (decode)", medusa, "measured", ">=", 1.25),
              ("c of EAGLE at its best chain, open questions", chain, "c", "<=", 0.08),
              ("Draft model at its best γ, open questions (decode)", draft, "measured", ">=", 1.0),
              ("Draft model acceptance at position 1, γ = 4, open questions", draft4, "position_1", ">=", 0.45),
              ("Draft model mean acceptance length, γ = 4, open questions", draft4, "mean_acceptance_length", ">=",
               1.7),
              ("c of the draft model, γ = 4, open questions", draft4, "c", "<=", 0.1)]
    rows = [(what, row[key] if row["identical"] else None, op, bound,
             f"{row[key]:.{3 if key in ('c', 'position_1') else 2}f} "
             f"({row['config']}{'' if row['identical'] else ', output differs'})")
            for what, row, key, op, bound in checks if row is not None]
    trees = tree_goals(tree_rows(open_rows))
    if b := out.get("block"):   # judged on what each rule accepts on average given the drafts: the counts beside
        se = f" ± {b['counted_gain_se']:.3f}" if b.get("counted_gain_se") else ""     # it carry the draws' noise
        trees.append(("Block verification's L over standard's (EAGLE γ = 3, temperature 1, summaries; on average "
                      "over the draws, given the drafts)", b["block_expected"] / b["standard_expected"], ">=", 1.0,
                      f"{b['block_expected']:.3f} / {b['standard_expected']:.3f} ({b['rounds']} rounds; counted: "
                      f"{b['block']:.3f} / {b['standard']:.3f}, difference {b['block'] - b['standard']:+.3f}{se})"))
    lines = [f"{out['model']}, chat, temperature 0, {out['threads']} thread(s), {out['max_tokens']} tokens, "
             f"{out['repeats']} repeats. Heads: {heads}. Spec-Bench (Vicuna-7B, A100) mean acceptance lengths for "
             f"comparison: {', '.join(f'{m} {v}' for m, v in SPEC_BENCH.items())}.",
             *(set_table(label, r) for label, r in sets.items()), goals(rows + trees + (
                 [("measured (decode) against predicted, every row, % off", 100 * error, "<=", 10, f"{error:.1%}")]
                 if error is not None else []))]
    lines += [acceptance_table(out[k], title) for k, title in (
        ("vllm", "Our EAGLE head in vLLM (its EAGLE layout)"),
        ("draft_model", "Our draft model in llama.cpp (its GGUF; its target SmolLM2 Q4_1, ours float32)")) if k in out]
    if "vllm_draft" in out:                    # vLLM's steps with our draft model beside ours
        lines.append(table(*c) if (c := crosscheck_table(out["vllm_draft"]))[1] else f"**{c[2]}** (all else equal)")
    if "by_threads" in out:
        lines += threads_tables(out["by_threads"])
    return lines


def add_parser(bsub) -> None:
    b = add_bench(bsub, "heads", "SmolLM2: EAGLE and Medusa heads, chains and token trees, against plain decoding "
                  "(fresh generations)", run, tables,
                  quick="one prompt per set, eagle and medusa at γ = 3 and one tree each")
    b.add_argument("--max-tokens", type=int, default=96)
    b.add_argument("--repeats", type=int, default=2)
    b.add_argument("--no-vllm", action="store_true",
                   help="leave out vLLM with our EAGLE head and our draft model (each starts a vLLM server: 3.6 GB)")
    b.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads for the weight products (default: measured at load, as serve does)")
    b.add_argument("--compare-threads", action="store_true",
                   help="also sweep EAGLE's γ and threshold at 1 and N threads, taking turns (the demo's defaults "
                        "per thread count)")
