"""Draft models shipped for fetched targets: models/drafts/TARGET/, distilled from the target in numpy
(`decoding-playground train-draft TARGET`, engine/training/draft_train.py; its model card is the folder's README).

    models/drafts/smollm2-135m/   config.json, model.safetensors (LlamaForCausalLM, float16),
                                  vocab_subset.json (the frequent-token subset S), README.md, training.json

A draft is read by the same checkpoint code as its target (engine/model/checkpoint.py) and drafts with the
target's tokenizer and chat template: it was trained on the target's own token ids, so its folder holds no
tokenizer of its own. The registry pairs it with the target of the folder's name when their vocabularies are
the same size (a checkpoint made for another tokenizer is refused with a warning); its weights are loaded on
first use, as the fetched target's.

With vocab_subset.json its LM head keeps the columns of S only (`restrict_lm_head`): the draft step stops paying
for the whole vocabulary, and the context's tokens outside S get their logits from the same rows
(engine/spec_decode/subset_draft.py).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError, load_checkpoint, load_config
from .fetched import LazyModel
from .layout import choose_split_rows
from .llama import Model
from .loaded_model import LoadedModel

logger = logging.getLogger(__name__)
DRAFTS_DIR = Path(__file__).resolve().parents[2] / "models" / "drafts"
SUBSET_FILE = "vocab_subset.json"


def restrict_lm_head(model: Model, ids, norm_weight, head_embed) -> Model:
    """Keep the LM head's columns of tokens `ids` only: the forward's logits are then [n, len(ids)], column j for
    token ids[j]. Kept for the rows of other tokens (engine/spec_decode/subset_draft.py): the output embedding
    head_embed [V, C] and the final norm's weight times sqrt(C) [C] (the forward's last hidden state is x / |x|)."""
    ids = np.asarray(ids, np.int64)
    if ids.ndim != 1 or not len(ids) or ids.min() < 0 or ids.max() >= model.cfg.vocab_size:
        raise ValueError(f"the LM head's subset must be token ids in 0..{model.cfg.vocab_size - 1}")
    model.lm_head = np.ascontiguousarray(model.lm_head[:, ids])                     # [C, Vs]
    model.lm_head_ids = ids                                                         # [Vs]
    model.lm_head_embed = head_embed                                                # [V, C]
    model.lm_head_norm = (np.asarray(norm_weight, np.float32) * np.float32(np.sqrt(model.cfg.hidden_size)))
    return model


def full_vocabulary_head(head, ids, dtype=np.float16):  # head [V, C], ids [Vs] -> [V, C] in dtype
    """A full-vocabulary LM head that chooses greedily as the head restricted to `ids` (S) does, for engines whose
    LM head is one [V, C] matrix (llama.cpp, vLLM): S's rows kept, every other row the mean of S's rows.

    A token outside S then gets the mean of S's logits, which is below their maximum for every hidden state h != 0
    (the logits are linear in h, the LM head having no bias): the mean is a combination of S's rows with weights
    all > 0, so it equals the maximum only where all of S's logits are equal, that is where h is orthogonal to every
    difference of two rows of S, and those differences span the hidden space (checked). Rounded to `dtype` the
    mean moves; the rounded row is checked to be such a combination still (its weights solved in float64), so the
    property holds for the stored values. A context's tokens outside S (engine/spec_decode/subset_draft.py) are
    not in it: a fixed matrix cannot depend on the context."""
    head, ids = np.asarray(head), np.asarray(ids, np.int64)
    rows = head[ids].astype(np.float64)                                             # [Vs, C]
    mean = rows.mean(axis=0)                                                        # [C]
    stored = mean.astype(dtype)
    a = np.vstack([rows.T, np.ones(len(ids))])                                      # [C + 1, Vs]: sum w_s x_s, sum w_s
    if np.linalg.matrix_rank(a) < a.shape[0]:
        raise ValueError("the subset's LM head rows do not span the hidden space: a row outside it could tie")
    shift = np.linalg.lstsq(a, np.append(stored.astype(np.float64) - mean, 0.0), rcond=None)[0]    # [Vs]
    if (1.0 / len(ids) + shift).min() <= 0:
        raise ValueError(f"the mean of the subset's rows rounded to {np.dtype(dtype).name} is no longer inside them")
    out = np.broadcast_to(stored, head.shape).astype(dtype)                         # [V, C]
    out[ids] = head[ids]
    return out


def load_draft(path: Path, subset: bool = True) -> Model:
    """A shipped draft's Model (float32); subset: its LM head restricted to vocab_subset.json if the folder has one."""
    cfg, weights, _ = load_checkpoint(path, with_tokenizer=False)      # the same code as every checkpoint's
    model = Model(cfg.replace(name=f"{Path(path).name}-draft"), weights)
    f = Path(path) / SUBSET_FILE
    if subset and f.is_file():
        head = model.embed if cfg.tie_word_embeddings else np.ascontiguousarray(weights["lm_head.weight"])
        restrict_lm_head(model, json.loads(f.read_text()), weights["model.norm.weight"], head)
    return choose_split_rows(model)      # its products' row split, measured as any loaded model's (loaded_model.py)


def shipped_drafts(targets: list[LoadedModel], drafts_dir: str | Path = DRAFTS_DIR) -> list[LoadedModel]:
    """A draft LoadedModel for each target with a checkpoint in drafts_dir/TARGET (weights loaded on first use)."""
    out = []
    for target in targets:
        folder = Path(drafts_dir) / target.name
        if not (folder / "model.safetensors").is_file():
            continue
        try:
            cfg = load_config(folder).replace(name=f"{target.name}-draft")
        except CheckpointError as e:
            logger.warning("%s: draft model unreadable (%s), not offered", folder, e)
            continue
        if cfg.vocab_size != target.cfg.vocab_size:
            logger.warning("%s: a draft of %d tokens for %s of %d: not its vocabulary, not offered", folder,
                           cfg.vocab_size, target.name, target.cfg.vocab_size)
            continue
        subset = folder / SUBSET_FILE
        meta = {"draft_for": target.name,
                "lm_head": f"{len(json.loads(subset.read_text())):,} frequent tokens + the context's"
                if subset.is_file() else "full vocabulary",
                "description": f"distilled from {target.name} in numpy (train-draft; model card: {folder.name}/README.md)"}
        out.append(LoadedModel(cfg.name, "draft", cfg, LazyModel(folder, cfg, load_draft), target.tokenizer,
                               str(folder), meta))
    return out
