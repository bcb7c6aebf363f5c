"""KV cache memory: the formula on public model configs, and the waste that paging removes.

    KV bytes = layers x 2 (K and V) x KV heads x (head dim x bytes per element + scale bytes) x tokens x sequences

Use num_key_value_heads, not num_attention_heads. Layers with a sliding window (gpt-oss) hold at most
the window's tokens. The dtypes are our cache's (engine/kv/dtypes.py), scales included: int8 keeps one
float16 scale per token and KV head, the same rule for public configs as for our models.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import resolve_kv_cache_dtype

KIB, MIB, GIB = 2 ** 10, 2 ** 20, 2 ** 30
WEIGHT_BYTES_PER_PARAMETER = 2       # the weights as the public checkpoints ship them: bf16


@dataclass(frozen=True)
class PublicConfig:
    """The fields of a model's official config.json that decide its KV cache (and weights, for drafts)."""
    name: str
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    parameters: float
    max_position_embeddings: int
    sliding_window: int | None = None
    sliding_layers: int = 0            # layers that use the window (the rest attend to everything)

    def bytes_per_token(self, element_bytes: float = 2, context: int | None = None, scale_bytes: int = 0) -> float:
        """Per token of a sequence of `context` tokens (sliding layers hold only the window's tokens);
        `scale_bytes` per token and KV head, for K and for V (int8's float16 scale: 2)."""
        per_layer = 2 * self.num_key_value_heads * (self.head_dim * element_bytes + scale_bytes)
        full = (self.num_hidden_layers - self.sliding_layers) * per_layer
        if not self.sliding_layers or context is None:
            return full + self.sliding_layers * per_layer
        held = min(context, self.sliding_window)
        return full + self.sliding_layers * per_layer * held / context

    def kv_bytes(self, context: int, sequences: int = 1, element_bytes: float = 2, scale_bytes: int = 0) -> float:
        return self.bytes_per_token(element_bytes, context, scale_bytes) * context * sequences

    @property
    def weight_bytes(self) -> float:
        return self.parameters * WEIGHT_BYTES_PER_PARAMETER


# From each model's official config.json on Hugging Face (as the first seed article checked them).
PUBLIC_CONFIGS = {c.name: c for c in [
    PublicConfig("Qwen3-8B", 36, 8, 128, 8.2e9, 40960),
    PublicConfig("Qwen2.5-72B-Instruct", 80, 8, 128, 72.7e9, 32768),
    PublicConfig("Mistral-7B-v0.1", 32, 8, 128, 7.24e9, 32768),
    PublicConfig("Llama-3.1-8B", 32, 8, 128, 8.03e9, 131072),
    PublicConfig("Llama-3.2-1B", 16, 8, 64, 1.24e9, 131072),
    PublicConfig("gpt-oss-20b", 24, 8, 64, 20.9e9, 131072, sliding_window=128, sliding_layers=12),
]}


def calculator(name: str, context: int, sequences: int, kv_cache_dtype: str = "bfloat16",
               draft: str | None = None) -> dict:
    """Bytes per token and the KV cache at context x sequences, the weights, a draft's weights and KV, and
    the total that must fit. `kv_cache_dtype`: one of engine/kv/dtypes.py's (or an alias: float32)."""
    cfg = PUBLIC_CONFIGS[name]
    dtype = resolve_kv_cache_dtype(kv_cache_dtype)
    eb, sb = dtype.element_bytes, dtype.scale_bytes
    out = {"model": name, "context": context, "sequences": sequences, "kv_cache_dtype": kv_cache_dtype,
           "element_bytes": eb, "scale_bytes": sb, "bytes_per_token": cfg.bytes_per_token(eb, context, sb),
           "kv_bytes": cfg.kv_bytes(context, sequences, eb, sb), "weight_bytes": cfg.weight_bytes}
    if draft:
        d = PUBLIC_CONFIGS[draft]
        out.update(draft=draft, draft_weight_bytes=d.weight_bytes,
                   draft_bytes_per_token=d.bytes_per_token(eb, context, sb),
                   draft_kv_bytes=d.kv_bytes(context, sequences, eb, sb))
    out["total_bytes"] = out["weight_bytes"] + out["kv_bytes"] + out.get("draft_weight_bytes", 0) + \
        out.get("draft_kv_bytes", 0)
    return out


def paging_waste(lengths, block_size: int | None, max_len: int = 2048) -> float:
    """Share of reserved KV slots never used: preallocating max_len per request (block_size None), or
    allocating blocks of block_size as a request grows (only its last block is partly empty)."""
    lengths = np.asarray(lengths)
    if block_size is None:
        reserved = max_len * len(lengths)
    else:
        reserved = int((-(-lengths // block_size) * block_size).sum())
    return 1 - lengths.sum() / reserved


def seed_request_mix(n: int = 1000, low: int = 50, high: int = 2047, seed: int = 0) -> np.ndarray:
    """The first seed article's mix: n requests with lengths uniform in [low, high]."""
    return np.random.default_rng(seed).integers(low, high + 1, n)
