"""KV cache dtypes, named as vLLM's `kv_cache_dtype`, and what one token costs in each.

- auto                 the model's float32
- float16, bfloat16    a plain cast
- fp8_e4m3, fp8_e5m2   real 8-bit floats (ml_dtypes) with one float32 scale per layer for K and one for
                       V, as vLLM's `calculate_kv_scales`: scale = amax(first write) / 200 for K and / 100
                       for V (its K_SCALE_CONSTANT / V_SCALE_CONSTANT), values saturate beyond.
- int8_per_token_head  int8 with one float16 absmax scale per token and KV head (the seed's scheme).
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..model.config import ModelConfig


@dataclass(frozen=True)
class KVCacheDType:
    name: str
    storage: np.dtype
    scale: str                 # "none" | "per_tensor" | "per_token_head"
    scale_bytes: int = 0       # bytes of scale per token and KV head (per-token scales only)

    @property
    def element_bytes(self) -> int:
        return np.dtype(self.storage).itemsize

    @property
    def max_value(self) -> float:
        return float(ml_dtypes.finfo(self.storage).max) if self.scale == "per_tensor" else 127.0


KV_CACHE_DTYPES = {
    "auto": KVCacheDType("auto", np.dtype(np.float32), "none"),
    "float16": KVCacheDType("float16", np.dtype(np.float16), "none"),
    "bfloat16": KVCacheDType("bfloat16", np.dtype(ml_dtypes.bfloat16), "none"),
    "fp8_e4m3": KVCacheDType("fp8_e4m3", np.dtype(ml_dtypes.float8_e4m3fn), "per_tensor"),
    "fp8_e5m2": KVCacheDType("fp8_e5m2", np.dtype(ml_dtypes.float8_e5m2), "per_tensor"),
    "int8_per_token_head": KVCacheDType("int8_per_token_head", np.dtype(np.int8), "per_token_head", 2),
}
ALIASES = {"fp32": "auto", "float32": "auto", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
           "fp8": "fp8_e4m3", "int8": "int8_per_token_head"}
# vLLM's calculate_kv_scales divides amax by these (K_SCALE_CONSTANT, V_SCALE_CONSTANT).
FP8_SCALE_DIVISOR = np.array([200.0, 100.0])


def resolve_kv_cache_dtype(name: str) -> KVCacheDType:
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"not a KV cache dtype: one of {', '.join(KV_CACHE_DTYPES)} "     # (no echo: the caller's)
                         f"(aliases: {', '.join(ALIASES)})")
    return KV_CACHE_DTYPES[key]


def kv_bytes_per_token(cfg: ModelConfig, dtype: KVCacheDType | str) -> int:
    """layers x 2 (K and V) x KV heads x (head_dim x element bytes + per-token scale bytes)."""
    if isinstance(dtype, str):
        dtype = resolve_kv_cache_dtype(dtype)
    per_head = cfg.head_dim * dtype.element_bytes + dtype.scale_bytes
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * per_head


def quantize_per_token_head(x):  # [..., hd] float32 -> int8 [..., hd], float16 scale [...]
    scale = (np.abs(x).max(axis=-1) / np.float32(127.0)).astype(np.float16)
    safe = np.maximum(scale.astype(np.float32), np.float32(1e-30))[..., None]
    return np.rint(x / safe).clip(-127, 127).astype(np.int8), scale
