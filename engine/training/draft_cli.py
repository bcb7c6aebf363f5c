"""`decoding-playground train-draft TARGET {measure,data,train,eval,export}`: a small draft model for a chat target.

    measure  c, a draft decode step over the target's, for candidate shapes (engine/training/draft_shape.py),
             interleaved with the target's decode steps; a table, and the largest candidate within --c-max
    data     the target's own greedy answers to the heads' chat prompts (engine/training/head_prompts.py) with
             its top-k next-token distribution at every position (--topk, default 32); resumable;
             --held-out answers the held-out prompts into FOLDER/heldout instead
    train    distillation (engine/training/draft_train.py); --resume continues FOLDER/state (run it in the
             background: `nice -n 19 ... train --resume`); the data folder is re-read while it grows
    eval     held-out greedy acceptance per position, offline, of the training state or of a checkpoint (--checkpoint)
    export   the Hugging Face checkpoint into models/drafts/TARGET/ (or --out): config.json, model.safetensors
             (float16), vocab_subset.json, training.json and the model card README.md; --tokenizer: the target's
             tokenizer files too (the engine drafts with the target's own; a tool that reads a folder on its own
             needs them); --format vllm: the shipped draft in vLLM's draft-model layout
             (engine/training/vllm_draft_export.py), into --out (default: the cache's vllm/drafts/TARGET, where
             `serve --vllm` reads it)

Data and training state live outside the repository: $DECODING_PLAYGROUND_CACHE/drafts/TARGET/. Held-out answers:
FOLDER/heldout, else the draft heads' (train-heads TARGET data --held-out), which hold the same prompts' answers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

DRAFTS_DIR = Path(__file__).resolve().parents[2] / "models" / "drafts"


def drafts_cache(target: str) -> Path:
    from ..model.fetched import cache_dir
    return cache_dir() / "drafts" / target


def held_out_dir(target: str, folder: Path) -> Path | None:
    from .head_cli import heads_cache
    for d in (folder / "heldout", heads_cache(target) / "heldout"):
        if (d / "conversations.jsonl").is_file():
            return d
    return None


def _target(name: str):  # -> the target's path, config and weights (float32)
    from ..model.checkpoint import load_checkpoint
    from ..serving.registry import ModelRegistry
    lm = ModelRegistry.from_dir().get(name)
    if lm.tokenizer.chat_template is None:
        raise SystemExit(f"{name} has no chat template: train-draft distils a chat model's answers")
    cfg, w, _ = load_checkpoint(lm.path, with_tokenizer=False)
    return Path(lm.path), cfg, w


def _trainer(args, log, resume: bool):  # -> the trainer, the target's folder
    import numpy as np

    from .draft_train import DraftTrainConfig, DraftTrainer
    path, cfg, w = _target(args.target)
    known = {f.name for f in fields(DraftTrainConfig)}
    given = json.loads(args.config or "{}")
    unknown = sorted(set(given) - known)
    if unknown:
        raise SystemExit(f"--config: unknown settings {unknown}; known: {sorted(known)}")
    folder = Path(args.folder or drafts_cache(args.target))
    state = folder / "state" / "state.npz"
    if state.is_file() and not given:               # a resumed run keeps the settings it started with
        given = json.loads(str(np.load(state)["meta"]))["train_config"]
    return DraftTrainer(DraftTrainConfig(**given), cfg, w["model.embed_tokens.weight"], folder / "data",
                        folder / "state", held_out_dir(args.target, folder), resume=resume, log=log), path


def _measure(args, log) -> None:
    from ..model.layout import use_fastest_layout
    from ..model.llama import Model
    from .draft_shape import c_table, candidates, largest_within, measure_c
    path, cfg, w = _target(args.target)
    model = Model(cfg, w)
    del w
    model = use_fastest_layout(model)            # as the engine runs it (engine/model/fetched.py)
    rows = measure_c(model, cfg, candidates(cfg.vocab_size), context=args.context, rounds=args.rounds, log=log)
    table = c_table(rows) + f"\n\nHost: {cpu_name()}."
    print(table)
    best = largest_within(rows, args.c_max)
    print(f"\nthe largest candidate with median c <= {args.c_max}: {best['label'] if best else 'none'}")
    folder = Path(args.folder or drafts_cache(args.target))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c_table.md").write_text(table + "\n")          # for the model card (export)


def default_status(info: dict) -> str:
    steps, planned = info["steps"], info["config"]["steps"]
    if steps >= planned:
        return f"The finished draft: all {planned:,} steps of its training schedule."
    return f"An unfinished run, exported at step {steps:,} of {planned:,}: the figures are that step's."


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or "unknown CPU"


def run(args: argparse.Namespace) -> int:
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.0f}s] {msg}", file=sys.stderr, flush=True)
    folder = Path(args.folder or drafts_cache(args.target))
    if args.stage == "measure":
        _measure(args, log)
    elif args.stage == "data":
        from ..model.thread_choice import request_threads
        from ..serving.registry import ModelRegistry
        from .head_data import build
        from .head_prompts import draft_train_prompts, held_out_prompts
        request_threads(1)                           # one core: the machine is shared, and other runs go on beside it
        lm = ModelRegistry.from_dir().get(args.target)
        if args.held_out:
            build(folder / "heldout", lm, n_open=args.prompts or 96, prompts=held_out_prompts(), log=log, topk=args.topk)
        else:
            build(folder / "data", lm, n_open=args.prompts or 576, prompts=draft_train_prompts(),
                  derived_every=args.derived_every, log=log, topk=args.topk)
    elif args.stage == "train":
        _trainer(args, log, resume=args.resume)[0].run()
    elif args.stage == "eval":
        trainer = _trainer(args, log, resume=True)[0]
        if args.checkpoint:
            from ..model.checkpoint import load_checkpoint
            trainer.cfg, trainer.st.params, _ = load_checkpoint(args.checkpoint, with_tokenizer=False)
        if not trainer.held_out:
            raise SystemExit(f"no held-out answers: run `decoding-playground train-draft {args.target} data --held-out`")
        from .draft_train import acceptance
        done = Path(args.checkpoint or "") / "training.json"
        step = json.loads(done.read_text())["steps"] if args.checkpoint and done.is_file() else None
        out = {"draft": args.checkpoint or "training state", "step": step if args.checkpoint else trainer.st.step,
               "conversations": len(trainer.held_out),
               **acceptance(trainer.st.params, trainer.cfg, trainer.held_out, trainer.subset, args.gamma)}
        print(json.dumps(out, indent=1))
    elif args.format == "vllm":
        from ..model.fetched import cache_dir
        from .vllm_draft_export import export_draft_for_vllm
        out = export_draft_for_vllm(args.target, Path(args.out or cache_dir() / "vllm" / "drafts" / args.target))
        log(f"wrote {out} (vLLM's draft-model layout)")
    else:
        from .draft_card import card, shipped_c_table
        trainer, path = _trainer(args, log, resume=True)
        out = Path(args.out or DRAFTS_DIR / args.target)
        info = trainer.export(out, path if args.tokenizer else None, args.vocab_subset)
        table = folder / "c_table.md"
        c_rows = table.read_text().strip() if table.is_file() else shipped_c_table(out / "README.md")
        (out / "README.md").write_text(card(args.target, info, c_rows, args.status or default_status(info)))
        log(f"wrote {out}: step {info['steps']}, held-out acceptance {json.dumps(info.get('held_out', {}).get('full'))}")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train-draft", help="distil a small draft model from a chat target (numpy)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a chat target's name (decoding-playground models), e.g. smollm2-135m")
    p.add_argument("stage", choices=("measure", "data", "train", "eval", "export"))
    p.add_argument("--folder", help="data and state folder (default: the cache's drafts/TARGET)")
    p.add_argument("--prompts", type=int, help="data: how many chat prompts to answer (default 576; 96 held out)")
    p.add_argument("--derived-every", type=int, default=3, metavar="N",
                   help="data: a summary or rewrite of every N-th of the target's prose answers (default 3)")
    p.add_argument("--topk", type=int, default=32, help="data: the target's most probable next tokens stored per position")
    p.add_argument("--held-out", action="store_true", help="data: answer the held-out prompts into FOLDER/heldout")
    p.add_argument("--config", help='train: settings as JSON (engine/training/draft_train.py DraftTrainConfig), '
                                    'e.g. \'{"steps": 3000, "hidden_size": 256}\'; a resumed run keeps its own')
    p.add_argument("--resume", action="store_true", help="train: continue FOLDER/state/state.npz if it exists")
    p.add_argument("--checkpoint", help="eval: a checkpoint folder (default: the training state)")
    p.add_argument("--gamma", type=int, default=4, help="eval: the longest chain to score")
    p.add_argument("--out", help="export: the checkpoint folder (default models/drafts/TARGET)")
    p.add_argument("--vocab-subset", type=int, help="export: the size of vocab_subset.json (default: the training's)")
    p.add_argument("--status", help="export: the model card's first paragraph (what this checkpoint is; default: "
                                    "the finished draft, or the step of an unfinished run)")
    p.add_argument("--tokenizer", action="store_true", help="export: copy the target's tokenizer files beside it")
    p.add_argument("--format", choices=("ours", "vllm"), default="ours",
                   help="export: ours (the shipped folder, from the training state) or vllm (the shipped draft in "
                        "vLLM's draft-model layout)")
    p.add_argument("--rounds", type=int, default=12, help="measure: interleaved rounds (default 12)")
    p.add_argument("--context", type=int, default=256, help="measure: the context length of the timed steps")
    p.add_argument("--c-max", type=float, default=0.1, help="measure: the largest c a chosen shape may have")
    p.set_defaults(func=run)
    return p
