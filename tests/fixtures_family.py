"""A stand-in model family on disk (random weights, real safetensors and tokenizer.json files), for tests
that must not depend on which tokens the shipped models happen to write."""
from __future__ import annotations

import json
from pathlib import Path

from engine.model.checkpoint import init_weights, save_checkpoint
from engine.model.config import ModelConfig
from engine.model.tokenizer import TextTokenizer

CHARS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789():\n\t.,=_+-*/'\"[]{}#<>!"


def write_family(root: Path) -> Path:
    tok = TextTokenizer.char_level(CHARS)
    base = ModelConfig.from_name("tiny").replace(vocab_size=tok.vocab_size, max_position_embeddings=256)
    entries = []
    for name, role, seed, kw in [("target-mha", "target", 1, dict(num_key_value_heads=4)),
                                 ("target-gqa", "target", 2, dict(num_key_value_heads=2)),
                                 ("target-mqa", "target", 3, dict(num_key_value_heads=1)),
                                 ("draft", "draft", 4, dict(hidden_size=16, num_hidden_layers=1))]:
        cfg = base.replace(**kw)
        save_checkpoint(root / name, cfg, init_weights(cfg, seed=seed, std=0.3), tok)
        entries.append({"name": name, "path": name, "role": role, "val_loss": None})
    (root / "index.json").write_text(json.dumps(entries, indent=2))
    return root
