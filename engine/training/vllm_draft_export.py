"""A shipped draft model (models/drafts/TARGET/) as the Hugging Face checkpoint vLLM's `"method": "draft_model"`
loads: `serve --vllm` writes it into our cache (vllm/drafts/TARGET/), as it writes our EAGLE head in vLLM's layout
(vllm_export.py); `train-draft TARGET export --format vllm --out DIR` writes it anywhere.

    export_draft_for_vllm("smollm2-135m", out)    # out/{config.json, model.safetensors, tokenizer files, export.json}

The decoder is copied as it is (float32: what vLLM computes in with `--dtype float32`). The LM head is not:
our engine drafts from the rows of S (vocab_subset.json, the training answers' frequent tokens) plus the
context's tokens (engine/spec_decode/subset_draft.py); vLLM from one full-vocabulary head, fixed at start-up.
The tied head is untied, with the rows of S as they were and every other row zero: those tokens' logits are 0,
below the subset's best on every held-out position tested (tests/smollm2/test_vllm_draft_export.py states the
margin), so greedy, vLLM drafts the argmax over S. The full head would not do: its rows outside S were never
trained (the loss sampled S plus the teacher's tokens) and win at about one position in five.

What is not exact, and why:
- the context's tokens outside S, which ours can draft (a rare name of the prompt), vLLM cannot: a checkpoint's
  rows cannot depend on the request. Where such a token is our argmax, the drafts differ;
- zero rows cannot be proven to lose for every hidden state: no positive combination of the rows of S is zero
  (the rows do not surround the origin), so some direction of the final feature puts every logit of S at or below
  0. The test shows none of the held-out positions comes near it;
- with sampling, the zero rows take a share of vLLM's draft distribution (ours has none outside S and the
  context): still lossless (verification is exact), but not our q.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from ..model.checkpoint import load_checkpoint, save_checkpoint
from ..model.fetched import model_dir
from ..model.shipped_drafts import DRAFTS_DIR, SUBSET_FILE
from .vllm_export import export_is_current

FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def subset_lm_head(head: np.ndarray, subset) -> np.ndarray:  # [V, C], ids of S -> [V, C]
    """The LM head's rows of `subset`, every other row zero (their logits are 0 whatever the hidden state)."""
    out = np.zeros_like(head)
    ids = np.asarray(subset, np.int64)
    out[ids] = head[ids]
    return out


def export_draft_for_vllm(target: str, out: Path, drafts_dir: Path = DRAFTS_DIR, cache=None) -> Path:
    """Write (or keep, if it is of the same draft and format) the draft of `target` in vLLM's draft-model layout."""
    src = Path(drafts_dir) / target
    weights_file, subset_file = src / "model.safetensors", src / SUBSET_FILE
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file}: no draft model for {target} (train-draft {target} export)")
    digest = hashlib.sha256(weights_file.read_bytes() + (subset_file.read_bytes() if subset_file.is_file()
                                                         else b"")).hexdigest()
    out = Path(out)
    if export_is_current(out, "draft_sha256", digest, FORMAT_VERSION):
        return out
    cfg, weights, _ = load_checkpoint(src, with_tokenizer=False)
    head = weights["model.embed_tokens.weight"] if cfg.tie_word_embeddings else weights["lm_head.weight"]
    subset = json.loads(subset_file.read_text()) if subset_file.is_file() else None
    weights["lm_head.weight"] = head if subset is None else subset_lm_head(head, subset)
    save_checkpoint(out, cfg.replace(tie_word_embeddings=False), weights, dtype=np.float32)
    tokenizer_dir = model_dir(target, cache)
    for name in TOKENIZER_FILES:              # vLLM reads the target's; a tool that loads the folder alone needs them
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
    record = {"format_version": FORMAT_VERSION, "draft": str(src), "draft_sha256": digest, "target": target,
              "lm_head": "full vocabulary" if subset is None else f"the {len(subset):,} rows of {SUBSET_FILE}, the others zero"}
    (out / "export.json").write_text(json.dumps(record, indent=1) + "\n")
    return out
