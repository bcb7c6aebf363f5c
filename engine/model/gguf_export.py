"""Our checkpoint layout -> a llama.cpp GGUF, the reverse of engine/model/gguf.py: a shipped draft model
(engine/model/shipped_drafts.py) for llama.cpp's draft-model speculation beside its target's GGUF.

    ensure_draft_gguf("smollm2-135m", target_gguf, cache)     # fetch-model calls it; written once per draft

- Tensors under llama.cpp's names (gguf.py's TENSOR_NAMES reversed), the rows of Q and K in llama.cpp's order
  (`permute_rope_rows`, undone by the reader), matrices in float16, the 1-D norm weights in float32 (as llama.cpp's
  own converter keeps 1-D tensors).
- The tokenizer: every `tokenizer.*` field of the target's GGUF, with its type. llama.cpp takes a draft for a target
  only when their vocabularies agree (type, size, BOS and EOS, each token's text).
- The LM head: a draft whose head is a subset S (vocab_subset.json) gets an `output.weight` over the whole
  vocabulary that chooses greedily as the subset head does (`full_vocabulary_head`).

float16, not float32: the shipped draft is float16, so float16 keeps every one of its values exactly in half the
bytes (a draft step reads all of them); the one value it does not hold, the mean row of S, is checked to keep its
property once rounded to float16.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np

from .checkpoint import load_checkpoint
from .config import ModelConfig
from .gguf import TENSOR_NAMES, field, permute_rope_rows
from .shipped_drafts import DRAFTS_DIR, SUBSET_FILE, full_vocabulary_head

HF_TO_GGUF = {hf: name for name, hf in TENSOR_NAMES.items()}
SOURCE_FILES = ("config.json", "model.safetensors", SUBSET_FILE)     # a GGUF older than one of them is made again


def gguf_name(hf_name: str) -> str:
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"]:
        return HF_TO_GGUF[".".join(["model.layers.{i}", *parts[3:]])].format(i=parts[2])
    return HF_TO_GGUF[hf_name]


def draft_gguf_path(target: str, cache: str | Path) -> Path:
    """Where the draft of `target` is kept as a GGUF (beside the target's GGUF in the cache)."""
    return Path(cache) / "gguf" / f"{target}-draft.F16.gguf"


def write_gguf(path: Path, cfg: ModelConfig, weights: dict[str, np.ndarray], tokenizer_from: gguf.GGUFReader,
               metadata: dict[str, str]) -> Path:
    """A llama GGUF of `weights` (the Hugging Face layout) with the tokenizer fields of another GGUF; written to a
    temporary file and renamed, so that `path` is either absent or complete."""
    tokens = field(tokenizer_from, "tokenizer.ggml.tokens")
    if len(tokens) != cfg.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model's vocabulary {cfg.vocab_size}")
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    try:
        write_llama_gguf(tmp, cfg, weights, tokenizer_from, metadata)
        tmp.rename(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_llama_gguf(path: Path, cfg: ModelConfig, weights: dict[str, np.ndarray], tokenizer_from: gguf.GGUFReader,
                     metadata: dict[str, str]) -> None:
    w = gguf.GGUFWriter(path, "llama")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value in metadata.items():
        w.add_string(key, value)
    for key, value in (("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads), ("vocab_size", cfg.vocab_size),
                       ("attention.head_count_kv", cfg.num_key_value_heads), ("rope.dimension_count", cfg.head_dim)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", cfg.rope_theta)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    for key, f in tokenizer_from.fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for name, x in weights.items():
        if name.endswith("q_proj.weight"):
            x = permute_rope_rows(x, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            x = permute_rope_rows(x, cfg.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(x, np.float32 if x.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export_draft_gguf(folder: Path, target_gguf: Path, out: Path) -> Path:
    """The shipped draft in `folder` as a GGUF with the tokenizer of `target_gguf`, its LM head over the whole
    vocabulary (`full_vocabulary_head` where the folder has vocab_subset.json)."""
    cfg, weights, _ = load_checkpoint(folder, with_tokenizer=False)
    subset = folder / SUBSET_FILE
    if subset.is_file():
        head = weights["model.embed_tokens.weight"] if cfg.tie_word_embeddings else weights["lm_head.weight"]
        weights["lm_head.weight"] = full_vocabulary_head(head, json.loads(subset.read_text()))
        cfg = cfg.replace(tie_word_embeddings=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(out, cfg, weights, gguf.GGUFReader(str(target_gguf)),
                      {"general.name": f"{folder.name}-draft"})


def ensure_draft_gguf(target: str, target_gguf: Path, cache: str | Path, drafts_dir: Path = DRAFTS_DIR,
                      log=print) -> Path | None:
    """The GGUF of `target`'s shipped draft in the cache, written unless it is there and newer than the draft's
    files (as make decides); None when no draft is shipped for `target`."""
    folder = Path(drafts_dir) / target
    if not (folder / "model.safetensors").is_file():
        return None
    out = draft_gguf_path(target, cache)
    made = out.stat().st_mtime if out.is_file() else None
    if made is not None and all(made >= f.stat().st_mtime for f in map(folder.joinpath, SOURCE_FILES) if f.is_file()):
        return out
    log(f"fetch-model: writing {target}'s draft model as a GGUF for llama.cpp: {out}")
    return export_draft_gguf(folder, target_gguf, out)
