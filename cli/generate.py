"""`generate`, `check-distribution` and `models`: the engine from the command line."""
from __future__ import annotations

import argparse
import json
import sys

from engine.experiments.distribution import check_distribution, check_tree_distribution
from engine.model.thread_choice import current_choice, request_threads
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from engine.serving.request_fit import fit_request
from engine.serving.session import GenerationSession
from engine.serving.settings import GenerationSettings, SettingsError

BOOL_SETTINGS = {"chat", "kv_cache", "enable_prefix_caching"}


def add_settings_arguments(p) -> None:
    """One --flag per generation setting (dashes for underscores); unset flags keep the defaults."""
    for name, field in GenerationSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if name in BOOL_SETTINGS:
            p.add_argument(flag, dest=name, default=None, choices=["true", "false"],
                           help=f"true/false (default {str(field.default).lower()})")
        else:
            p.add_argument(flag, dest=name, default=None, help=f"{field.description or ''} (default {field.default})")


def settings_from_args(args) -> dict:
    return {name: getattr(args, name) for name in GenerationSettings.model_fields
            if getattr(args, name, None) is not None}


def load_engine(models_dir) -> InferenceEngine:
    return InferenceEngine(ModelRegistry.from_dir(models_dir or MODELS_DIR), max_sessions=1)


def cmd_generate(args) -> int:
    request_threads(args.threads)
    engine = load_engine(args.models_dir)
    try:
        fit = fit_request(engine.registry, settings_from_args(args))     # the flags left out: the model's defaults
        if fit.note:
            print(f"note: {fit.note}", file=sys.stderr)
        session = GenerationSession(engine, args.prompt, fit.settings)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    last = None
    for event in session.events():
        last = event
        if event.type == "token" and event.status != "rejected" and not args.json:
            print(event.text, end="", flush=True)
    if last.type == "error":
        print(f"\nerror: {last.message}", file=sys.stderr)
        return 1
    choice = current_choice()        # made only if the model streams its weights from memory (SmolLM2)
    threads = {"threads": choice.threads, "threads_reason": choice.reason} if choice else {"threads": None}
    if args.json:
        print(json.dumps({**last.summary, **threads}, indent=2))
    else:
        s = last.summary
        extra = f", acceptance {s['acceptance_rate']:.2f}" if s["acceptance_rate"] is not None else ""
        print(f"\n\n[{s['num_output_tokens']} tokens, {s['tokens_per_s']:.0f} tok/s{extra}, "
              f"finish: {s['finish_reason']}]", file=sys.stderr)
        if choice:
            print(f"[threads: {choice.threads}: {choice.reason}]", file=sys.stderr)
    return 0


TREE_FLAGS = ("model", "method", "num_speculative_tokens", "speculative_eagle_topk", "speculative_num_draft_tokens")


def cmd_check_distribution(args) -> int:
    engine = load_engine(args.models_dir)
    progress = None if args.json else lambda i, n: print(f"  {i:,}/{n:,}", file=sys.stderr)
    try:
        if args.tree == "true":              # the tree's flags left out take the tree mode's defaults
            asked = {name: getattr(args, name) for name in TREE_FLAGS if getattr(args, name) is not None}
            r = check_tree_distribution(engine, args.prompt, args.samples, args.temperature, args.seed, progress, asked)
        else:
            gamma = args.num_speculative_tokens or (2 if args.rejection_sample_method == "block" else 1)
            r = check_distribution(engine, args.prompt, args.samples, args.temperature, args.seed, progress,
                                   args.rejection_sample_method, gamma)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        (print_tree_check if r.get("tree") else print_chain_check)(r)
    return 0


def print_chain_check(r: dict) -> None:
    print(f"{r['prompt']!r} T={r['temperature']} samples={r['samples']:,} ({r['target']} vs draft {r['draft']}, "
          f"{r['rejection_sample_method']} verification, γ = {r['num_speculative_tokens']})")
    standard = r["standard_mean_acceptance_length"]
    print(f"mean_acceptance_length={r['mean_acceptance_length']:.4f}"
          + (f" (standard rule on the same draws: {standard:.4f})" if standard is not None else ""))
    print(f"accept_x1={r['acceptance_rate']:.4f} theory_sum_min(p,q)={r['theory_sum_min_p_q']:.4f} "
          f"TVD(spec,p)={r['tvd_speculative']:.4f} TVD(direct,p)={r['tvd_direct']:.4f} "
          f"TVD(draft_only,p)={r['tvd_draft_only']:.4f}")
    for t in r["top_tokens"]:
        print(f"  {t['text']!r:>8}  p={t['p']:.4f}  q={t['q']:.4f}  speculative={t['speculative']:.4f}")


def print_tree_check(r: dict) -> None:
    print(f"{r['prompt']!r} T={r['temperature']} samples={r['samples']:,} ({r['target']}, {r['method']} tree: depth "
          f"{r['num_speculative_tokens']}, top-k {r['speculative_eagle_topk']}, {r['speculative_num_draft_tokens']} "
          f"nodes at most, {r['mean_tree_nodes']:.1f} drafted)")
    draft_only = r["tvd_draft_only"]
    print(f"accept_first={r['acceptance_rate']:.4f} TVD(spec,p)={r['tvd_speculative']:.4f} "
          f"TVD(direct,p)={r['tvd_direct']:.4f} sampling noise={r['tvd_noise']:.4f}"
          + (f" TVD(q at the root,p)={draft_only:.4f}" if draft_only is not None else ""))
    for t in r["top_tokens"]:
        print(f"  {t['text']!r:>8}  p={t['p']:.4f}  speculative={t['speculative']:.4f}  direct={t['direct']:.4f}")


def cmd_models(args) -> int:
    registry = ModelRegistry.from_dir(args.models_dir or MODELS_DIR)
    rows = [m.describe() | {"config": m.cfg.to_hf_dict()} for m in registry.models.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        loss = r.get("val_loss")
        print(f"{r['name']:<12} {r['role']:<6} {r['attention']:<3} {r['num_hidden_layers']} layers x "
              f"{r['hidden_size']}, {r['num_attention_heads']}q/{r['num_key_value_heads']}kv heads, "
              f"{r['parameters']:,} params, val loss {loss if loss is None else f'{loss:.3f}'}  {r['path']}")
    return 0


def add_threads_argument(p) -> None:
    p.add_argument("-t", "--threads", type=threads_count, default=None, metavar="N",
                   help="threads for the weight products of models that stream from memory (SmolLM2); our small "
                        "models stay on one (default: every core of a 2-3 core machine, one left free from 4 on; logged with why)")


def threads_count(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"between 1 and 256, got {n}")
    return n


def add_parsers(sub) -> None:
    g = sub.add_parser("generate", help="one generation from the command line")
    g.add_argument("--prompt", required=True)
    g.add_argument("--json", action="store_true", help="print the JSON summary (docs/protocol.md)")
    g.add_argument("--models-dir", default=None)
    add_threads_argument(g)
    add_settings_arguments(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("check-distribution",
                       help="the seed's experiment: does speculative sampling reproduce the target's distribution?")
    c.add_argument("--prompt", required=True)
    c.add_argument("--samples", type=int, default=200_000)
    c.add_argument("--temperature", type=float, default=1.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--rejection-sample-method", default="standard", choices=["standard", "block"],
                   help="how a round's draft is verified: token by token (standard) or as a block")
    c.add_argument("--num-speculative-tokens", type=int, default=None, metavar="GAMMA",
                   help="draft tokens per round (default 1; 2 with block: with one draft token the rules are the "
                        "same); with --tree true the tree's depth (default 3)")
    c.add_argument("--tree", default="false", choices=["true", "false"],
                   help="true: draft a token tree (its first token against p, tree verification)")
    c.add_argument("--model", default=None, help="with --tree true: the target (default: the default model)")
    c.add_argument("--method", default=None, choices=["eagle", "medusa", "ngram"],
                   help="with --tree true: who drafts the tree (default eagle)")
    c.add_argument("--speculative-eagle-topk", type=int, default=None, metavar="K",
                   help="with --tree true: children per expanded node, 2-8 (default 4)")
    c.add_argument("--speculative-num-draft-tokens", type=int, default=None, metavar="N",
                   help="with --tree true: the tree's nodes at most (default 8)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--models-dir", default=None)
    c.set_defaults(func=cmd_check_distribution)

    m = sub.add_parser("models", help="the shipped models")
    m.add_argument("--json", action="store_true")
    m.add_argument("--models-dir", default=None)
    m.set_defaults(func=cmd_models)
