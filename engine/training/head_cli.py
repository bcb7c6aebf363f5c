"""`decoding-playground train-heads TARGET {data,train,eval,export}`: EAGLE and Medusa heads for a target.

    data    the target's own answers to chat prompts with its hidden states (a chat model such as
            smollm2-135m), or windows of the training corpus (our character models); resumable;
            --held-out answers held-out prompts into a separate folder
    train   both heads on that data, resumable from the state folder (run it in the background)
    eval    held-out acceptance per position and mean acceptance length at each γ, offline, from the
            held-out answers (`data --held-out`), of the training state or of exported heads (--heads);
            --on-training scores the last training conversations instead (how much better the heads do
            on answers they were taught: the gap is what more data could close); --trees adds, per
            budget, the EAGLE head's chain, best static tree and EAGLE-2 dynamic tree
    export  float16 safetensors into models/heads/TARGET/ (what the engine loads); SmolLM2's model
            card (README.md there) is written by `decoding-playground bench heads`, which measures the heads;
            --format vllm: the shipped EAGLE head in vLLM's EAGLE layout (engine/training/vllm_export.py), into
            $DECODING_PLAYGROUND_CACHE/vllm/heads/TARGET/ or --out

Data and training state live outside the repository: $DECODING_PLAYGROUND_CACHE/heads/TARGET/.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np


def heads_cache(target: str) -> Path:
    from ..model.fetched import cache_dir
    return cache_dir() / "heads" / target


def corpus_data(folder: Path, lm, windows: int = 384, length: int = 256, split: str = "train", log=print) -> None:
    """A character model's hidden states over fixed windows of its corpus's `split` (teacher forcing; "val"
    for held-out figures)."""
    from ..model.llama import forward
    from .corpus import load_corpus
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "feats").mkdir(exist_ok=True)
    if (folder / "conversations.jsonl").is_file():
        log("data exists")
        return
    train, val, _, _ = load_corpus()
    text = val if split == "val" else train
    starts = np.random.default_rng(0).integers(0, len(text) - length, windows)
    lines = []
    for i, s in enumerate(starts):
        ids = text[s:s + length].astype(np.int64)
        _, hidden = forward(lm.model, ids[:-1], 0, None, with_hidden=True)
        np.save(folder / "feats" / f"{i:05d}.npy", hidden.astype(np.float16))
        lines.append(json.dumps({"index": i, "prompt": f"corpus[{s}:{s + length}]", "kind": "corpus",
                                 "ids": ids.tolist(), "n_prompt": 1}))
    (folder / "conversations.jsonl").write_text("\n".join(lines) + "\n")
    log(f"{windows} windows of {length} characters")


def _trainer(args, log):
    from ..model.checkpoint import load_checkpoint
    from ..serving.registry import ModelRegistry
    from .head_train import HeadTrainConfig, HeadTrainer
    lm = ModelRegistry.from_dir().models[args.target]
    cfg, w, _ = load_checkpoint(lm.path, with_tokenizer=False)
    out_embed = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    known = {f.name for f in fields(HeadTrainConfig)}
    tc = HeadTrainConfig(**{k: v for k, v in json.loads(args.config or "{}").items() if k in known})
    folder = Path(args.folder or heads_cache(args.target))
    return HeadTrainer(tc, cfg, w["model.embed_tokens.weight"], out_embed, w["model.norm.weight"], folder / "data",
                       folder / "state", log=log)


def warm_start(init_from: str | None, previous: Path) -> dict | None:
    """What the training state was warm-started from: the exported heads' training.json in `init_from`, or, once
    that folder is gone, what the previous export from the same state (`previous`) recorded of it."""
    if not init_from:
        return None
    start = Path(init_from) / "training.json"
    if start.is_file():
        warm = json.loads(start.read_text())
        return {"steps": warm["steps"], "train_s": warm["train_s"], "answer_tokens": warm["data"]["answer_tokens"]}
    before = json.loads(previous.read_text()) if previous.is_file() else {}
    return before.get("warm_start") if before.get("config", {}).get("init_from") == init_from else None


def _tree_estimate(trainer, convs, args, log) -> dict:
    """eval --trees: the EAGLE head's chains, best static trees and dynamic trees per budget
    (engine/training/head_eval.py), with a table on stderr."""
    import math

    from ..spec_decode.heads import LMRows
    from .head_eval import eagle_tree_acceptance, tree_table
    eagle = {k: p for k, p in trainer.params.items() if not k.startswith("medusa.")}
    topks = tuple(int(k) for k in args.tree_topk.split(","))
    trees = eagle_tree_acceptance(eagle, trainer.eagle_cfg, convs, trainer.subset,
                                  LMRows({"head": trainer.out_embed, "norm": trainer.norm_w}), trainer.embed,
                                  np.float32(math.sqrt(trainer.target_cfg.hidden_size)), depth=args.tree_depth,
                                  budgets=tuple(range(1, args.tree_budget + 1)), topks=topks, log=log)
    log("mean acceptance length per budget (draft nodes verified; + 1 row for the root):\n" + tree_table(trees))
    return trees


def run(args: argparse.Namespace) -> int:
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.0f}s] {msg}", file=sys.stderr, flush=True)
    folder = Path(args.folder or heads_cache(args.target))
    if args.stage == "data":
        from ..serving.registry import ModelRegistry
        lm = ModelRegistry.from_dir().get(args.target)
        if lm.tokenizer.chat_template is not None:
            from .head_data import build
            from .head_prompts import held_out_prompts, more_train_prompts
            if args.held_out:
                build(folder / "heldout", lm, n_open=args.prompts or 96, prompts=held_out_prompts(), log=log)
            else:
                build(folder / "data", lm, n_open=args.prompts or 576, prompts=more_train_prompts(),
                      derived_every=args.derived_every, log=log)
        else:
            corpus_data(folder / ("heldout" if args.held_out else "data"), lm,
                        windows=args.prompts or (96 if args.held_out else 384),
                        split="val" if args.held_out else "train", log=log)
    elif args.stage == "train":
        _trainer(args, log).run()
    elif args.stage == "eval":
        trainer = _trainer(args, log)
        if args.heads:
            trainer.load_exported(Path(args.heads))
        if args.on_training:
            convs = trainer.convs[-(args.conversations or 100):]
        elif not trainer.held_out:
            raise SystemExit(f"no held-out answers in {folder / 'heldout'}: run `decoding-playground train-heads "
                             f"{args.target} data --held-out` first, or score training answers (--on-training)")
        else:
            convs = trainer.held_out[:args.conversations] if args.conversations else trainer.held_out
        out = {"heads": args.heads or "training state", "conversations": len(convs),
               "of": "the last training conversations" if args.on_training else "held out",
               **trainer.evaluate(convs, args.gamma)}
        if args.trees:
            out["eagle_trees"] = _tree_estimate(trainer, convs, args, log)
        print(json.dumps(out, indent=1))
    elif args.format == "vllm":
        from ..model.fetched import cache_dir
        from .vllm_export import export_eagle_for_vllm
        out = export_eagle_for_vllm(args.target, Path(args.out or cache_dir() / "vllm" / "heads" / args.target))
        log(f"wrote {out}: {json.loads((out / 'export.json').read_text())['scales']}")
    else:
        from ..spec_decode.heads import HEADS_DIR
        trainer = _trainer(args, log)
        out = Path(args.out or HEADS_DIR / args.target)
        warm = warm_start(trainer.trained_with.get("init_from"), out / "training.json")   # before it is overwritten
        info = trainer.export(out, args.vocab_subset)
        if warm:
            info["warm_start"] = warm
        if trainer.held_out:
            trainer.load_exported(out)                    # the float16 files as shipped
            info["held_out"] = {"conversations": len(trainer.held_out), **trainer.evaluate(trainer.held_out, 5)}
        (out / "training.json").write_text(json.dumps({**info, "history": trainer.history[-20:]}, indent=1))
        log(f"wrote {out}: {info}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train-heads", help="train EAGLE and Medusa draft heads for a target (numpy)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a target model name (decoding-playground models)")
    p.add_argument("stage", choices=("data", "train", "eval", "export"))
    p.add_argument("--folder", help="data and state folder (default: the cache's heads/TARGET)")
    p.add_argument("--prompts", type=int, help="data: how many chat prompts to answer (default 576; 96 held out), or corpus windows (384; 96)")
    p.add_argument("--derived-every", type=int, default=3, metavar="N",
                   help="data: a summary or rewrite of every N-th of the model's prose answers (default 3)")
    p.add_argument("--held-out", action="store_true",
                   help="data: answer held-out prompts into FOLDER/heldout instead (for `train`'s held-out figures)")
    p.add_argument("--config", help='training settings as JSON, e.g. \'{"steps": 3000, "vocab_subset": 8192}\'')
    p.add_argument("--out", help="export folder (default models/heads/TARGET)")
    p.add_argument("--heads", help="eval: a folder of exported heads (default: the training state)")
    p.add_argument("--gamma", type=int, default=4, help="eval: the longest chain to score")
    p.add_argument("--conversations", type=int,
                   help="eval: only the first N held-out conversations (the last N training ones, default 100)")
    p.add_argument("--on-training", action="store_true", help="eval: score the last training conversations")
    p.add_argument("--trees", action="store_true",
                   help="eval: also the EAGLE head's token trees per budget: the chain, the best static tree and "
                        "EAGLE-2's dynamic tree (minutes: the dynamic trees run the head on every node)")
    p.add_argument("--tree-depth", type=int, default=8, help="eval --trees: the deepest tree (default 8)")
    p.add_argument("--tree-budget", type=int, default=16, help="eval --trees: budgets 1..N nodes (default 16)")
    p.add_argument("--tree-topk", default="1,2,4,8",
                   help="eval --trees: the dynamic trees' children per node to try (default 1,2,4,8)")
    p.add_argument("--vocab-subset", type=int, help="export: the size of the heads' vocabulary subset (FR-Spec)")
    p.add_argument("--format", choices=("ours", "vllm"), default="ours",
                   help="export: ours (float16, from the training state) or vllm (the shipped EAGLE head in "
                        "vLLM's EAGLE layout, for `vllm serve --speculative-config '{\"method\": \"eagle\", ...}'`)")
    p.set_defaults(func=run)
    return p
