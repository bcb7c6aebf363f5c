"""`decoding-playground train`: retrain any shipped model (or the tiny CI model) from its preset.

Wire-up: `add_parser(subparsers)` adds the `train` sub-command and sets `func=run`; or call
`main(argv)` directly (`python -m engine.training.cli --preset ci-tiny`).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from ..model.config import ModelConfig
from .train import TrainConfig

# Training recipes of the shipped models. The architecture of each is engine.model.config.PRESETS[name].
RECIPES: dict[str, dict] = {
    "target-mha": dict(steps=3600, batch_size=4, seq_len=512, lr=3e-3, warmup_steps=100, eval_every=200,
                       notes="the target, trained from scratch"),
    # GQA / MQA as Ainslie et al.: mean-pool the MHA checkpoint's K/V heads, then uptrain for 5% of the MHA's
    # steps (180 of 3600, same batch). The uptraining loss is distillation from the MHA parent: cross-entropy
    # against its next-token distribution plus `distill_hidden` x the relative squared error between the
    # student's and the parent's residual streams after every layer. Plain distillation alone leaves GQA and
    # MQA well behind their parent's validation loss; the layer term closes much of the gap, its gain flattening
    # from weight 16 on, and a peak learning rate of 3e-3 did best among 0.75e-3 to 12e-3. The model cards set
    # each run's loss beside plain distillation's (PLAIN_DISTILLATION_RUNS in model_cards.py).
    "target-gqa": dict(steps=180, batch_size=4, seq_len=512, lr=3e-3, warmup_steps=20, min_lr_ratio=0.1,
                       eval_every=45, init_from="models/target-mha", distill_from="models/target-mha",
                       distill_hidden=16.0,
                       notes="2 KV heads mean-pooled from target-mha, uptrained by distillation from it"),
    "target-mqa": dict(steps=180, batch_size=4, seq_len=512, lr=3e-3, warmup_steps=20, min_lr_ratio=0.1,
                       eval_every=45, init_from="models/target-mha", distill_from="models/target-mha",
                       distill_hidden=16.0,
                       notes="1 KV head mean-pooled from target-mha, uptrained by distillation from it"),
    "draft": dict(steps=3000, batch_size=8, seq_len=512, lr=5e-3, warmup_steps=100, eval_every=250,
                  notes="the draft for speculative decoding, trained from scratch on the same corpus"),
    "draft-distilled": dict(arch="draft", steps=1000, batch_size=8, seq_len=512, lr=2e-3, warmup_steps=20, eval_every=100,
                            init_from="models/draft", distill_from="models/target-mha",
                            notes="the draft, fine-tuned on target-mha's next-token distribution"),
    "ci-tiny": dict(steps=30, batch_size=4, seq_len=64, lr=1e-2, warmup_steps=5, eval_every=10, eval_windows=4,
                    ckpt_every=10, log_every=5, max_files=10, notes="a seconds-long run for CI"),
}


def _describe() -> str:
    lines = ["presets (architecture from engine.model.config.PRESETS, recipe from engine.training.cli.RECIPES):"]
    for name, r in RECIPES.items():
        cfg = ModelConfig.from_name(r.get("arch", name))
        layers = f"{cfg.num_hidden_layers} layer{'s' if cfg.num_hidden_layers > 1 else ''}"
        teacher = f", teacher {r['distill_from']}" if r.get("distill_from") else ""
        if r.get("distill_hidden"):
            teacher += f" (and its residual stream after every layer, weight {r['distill_hidden']:g})"
        lines.append(
            f"  {name:<11} {layers} x width {cfg.hidden_size}, {cfg.num_attention_heads} "
            f"query / {cfg.num_key_value_heads} KV heads ({cfg.attention_kind}), {cfg.num_parameters():,} params; "
            f"{r['steps']} steps x {r['batch_size']} x {r['seq_len']} tokens, lr {r['lr']:g}"
            f"{', from ' + r['init_from'] if r.get('init_from') else ''}{teacher}\n"
            f"  {'':<11} {r['notes']}")
    lines += ["",
              "The corpus is the running interpreter's own stdlib sources (see engine/training/corpus.py).",
              "Shipped models were trained in this order: target-mha, then target-gqa and target-mqa",
              "(which start from models/target-mha), then draft. Set OPENBLAS_NUM_THREADS=1."]
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="retrain a shipped model (numpy, handwritten backprop)",
                              description="Train a model of the shipped family from scratch in numpy.",
                              epilog=_describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", required=True, choices=sorted(RECIPES), help="which model to train")
    p.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's)")
    p.add_argument("--out", help="output checkpoint folder (default: models/NAME)")
    p.add_argument("--state-dir", help="where the resumable training state goes (default: runs/NAME)")
    p.add_argument("--resume", action="store_true", help="continue from STATE_DIR/state.npz if it exists")
    p.add_argument("--seed", type=int, help="random seed (default 1337); same seed, same weights")
    p.add_argument("--init-from", help="for GQA/MQA: the MHA checkpoint folder to mean-pool K/V heads from")


def run(args: argparse.Namespace) -> int:
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        print("note: OPENBLAS_NUM_THREADS is not 1; on a shared 2-core machine this can be much slower",
              file=sys.stderr)
    from .train import train
    recipe = dict(RECIPES[args.preset])
    arch = recipe.pop("arch", args.preset)  # a recipe may continue another model (draft-distilled -> draft)
    recipe.update({k: v for k, v in dict(steps=args.steps, seed=args.seed, init_from=args.init_from).items()
                   if v is not None})
    tc = TrainConfig(preset=arch, **recipe)
    if args.steps is not None and args.steps < tc.warmup_steps * 5:
        tc = replace(tc, warmup_steps=max(1, args.steps // 10))
    out = Path(args.out or f"models/{arch}")
    summary = train(tc, out, state_dir=args.state_dir or Path("runs") / out.name, resume=args.resume,
                    log=lambda s: print(s, flush=True))
    print(f"saved {out}/ (val loss {summary['val_loss']:.4f} nats/char, {summary['train_seconds'] / 60:.1f} min)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="decoding-playground train",
                                description="Train a model of the shipped family from scratch in numpy.",
                                epilog=_describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
