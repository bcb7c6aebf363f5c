"""Checkpoints in the Hugging Face layout: config.json, model.safetensors, tokenizer.json.

Weights are a plain dict of arrays named and shaped as in `LlamaForCausalLM` (linear weights are
[out_features, in_features]). They are stored as float16 to keep the repository small and are
returned as float32, because numpy has no fast float16 matmul.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from .config import ModelConfig
from .tokenizer import TextTokenizer


class CheckpointError(ValueError):
    """A checkpoint file is missing or malformed; the message names the file and the problem."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    c, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, c), "model.norm.weight": (c,)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (c,),
            p + "self_attn.q_proj.weight": (nq * hd, c),
            p + "self_attn.k_proj.weight": (nkv * hd, c),
            p + "self_attn.v_proj.weight": (nkv * hd, c),
            p + "self_attn.o_proj.weight": (c, nq * hd),
            p + "post_attention_layernorm.weight": (c,),
            p + "mlp.gate_proj.weight": (i, c),
            p + "mlp.up_proj.weight": (i, c),
            p + "mlp.down_proj.weight": (c, i),
        })
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, c)
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
    shapes = expected_shapes(cfg)
    missing = sorted(shapes.keys() - weights.keys())
    if missing:
        raise CheckpointError(f"{source}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(
                f"{source}: tensor {name} has shape {tuple(weights[name].shape)}, config.json implies {shape}")
        if not np.all(np.isfinite(weights[name])):
            raise CheckpointError(f"{source}: tensor {name} contains NaN or infinity")


def save_checkpoint(path: str | Path, cfg: ModelConfig, weights: dict[str, np.ndarray],
                    tokenizer: TextTokenizer | None = None, dtype=np.float16) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    check_weights(cfg, weights, "save_checkpoint")
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = np.dtype(dtype).name
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in weights.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    # safetensors writes 0600; the weights get config.json's umask-given mode, so that another user (the
    # Docker image's, with the cache as a volume) can read them as it reads the config
    (path / "model.safetensors").chmod((path / "config.json").stat().st_mode & 0o777)
    if tokenizer is not None:
        tokenizer.save(path / "tokenizer.json")
    return path


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    f = path / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{f}: file not found")
    try:
        d = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{f}: expected a JSON object")
    if d.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{f}: hidden_act {d['hidden_act']!r} is not supported (only silu)")
    try:
        return ModelConfig.from_hf_dict(d, name=path.name)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{f}: {e}") from None


def load_checkpoint(path: str | Path, with_tokenizer: bool = True):
    """Load (config, weights as float32, tokenizer or None) from a Hugging Face layout folder."""
    path = Path(path)
    cfg = load_config(path)
    f = path / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{f}: file not found")
    try:
        raw = load_file(str(f))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
    weights = {k: v.astype(np.float32) for k, v in raw.items()}
    check_weights(cfg, weights, str(f))
    tokenizer = None
    if with_tokenizer:
        t = path / "tokenizer.json"
        if not t.is_file():
            raise CheckpointError(f"{t}: file not found")
        try:
            tokenizer = TextTokenizer.from_file(t)
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise CheckpointError(f"{t}: not a readable tokenizer ({e})") from None
        if tokenizer.vocab_size > cfg.vocab_size:
            raise CheckpointError(
                f"{t}: {tokenizer.vocab_size} tokens but config.json has vocab_size {cfg.vocab_size}")
    return cfg, weights, tokenizer


def init_weights(cfg: ModelConfig, seed: int = 0, std: float = 0.02) -> dict[str, np.ndarray]:
    """Random weights in the checkpoint layout (norms at 1); residual projections scaled down as GPT-2."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, np.float32)
        else:
            s = std / np.sqrt(2 * cfg.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            out[name] = (rng.standard_normal(shape) * s).astype(np.float32)
    return out
