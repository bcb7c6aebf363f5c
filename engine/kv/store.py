"""The numbers of a paged KV cache: `KVStore` holds, per layer, K and V for every slot of a pool in the cache
dtype, laid out [num_kv_heads, num_slots, head_dim] so that a run of consecutive blocks is one contiguous slice.
The block tables that say which slots a sequence owns are engine/kv/cache.py's."""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools

import numpy as np

from ..model.config import ModelConfig
from .dtypes import FP8_SCALE_DIVISOR, KVCacheDType, quantize_per_token_head

F32 = np.float32
try:
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)
except OSError:
    _MALLOC_TRIM = None


def trim_freed_memory() -> None:
    """Give the memory freed in this process back to the system (glibc's malloc_trim; elsewhere nothing).

    NOTE: a pool's per-layer arrays (SmolLM2 at 8 sessions: 26 MB each in float32, less in the other dtypes) are
    below glibc's largest mmap threshold, which rises to the size of each mapped block freed: after a pool is
    freed, pools of other dtypes come from the threads' malloc arenas, and memory freed there stays in the
    process (a server's resident memory kept growing past its pools' budget)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def gather(a, slots):  # [2, nkv, num_slots, ...] -> [2, nkv, T, ...]
    """Slots of a sequence: a view for a contiguous run, else one `take` (much cheaper than a[:, :, idx])."""
    return a[:, :, slots] if isinstance(slots, slice) else a.take(slots, axis=2)


class KVStore:
    """K and V numbers for every slot of one pool, per layer, in one cache dtype.

    NOTE: per layer one array kv[layer] of shape [2 (K, V), num_kv_heads, num_slots, head_dim], so that
    one write stores both and one slice (or one take) reads both.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: KVCacheDType):
        self.dtype, self.block_size = dtype, block_size
        self.num_slots = num_blocks * block_size
        shape = (2, cfg.num_key_value_heads, self.num_slots, cfg.head_dim)
        L = cfg.num_hidden_layers
        # Written now (np.full), not only allocated: np.zeros maps pages lazily, and the first write to each
        # page (a new block's K/V, for every KV head) faults inside a generation's measured forward, which
        # then counts the kernel's page faults as engine time.
        self.kv = [np.full(shape, 0, dtype.storage) for _ in range(L)]
        if dtype.scale == "per_token_head":     # [2, nkv, num_slots] float16
            self.scale = [np.full(shape[:3], 0, np.float16) for _ in range(L)]
        else:  # per-tensor (fp8): [2, 1, 1, 1] float32 for K and V, fixed by the first write to a layer
            self.scale = [None] * L

    def nbytes(self) -> int:
        """Bytes held per slot times slots (fp8's two per-layer float32 scales are not per token)."""
        per_token = list(self.kv) + (list(self.scale) if self.dtype.scale == "per_token_head" else [])
        return sum(a.nbytes for a in per_token)

    def write(self, layer: int, slots, kv) -> None:  # slots: slice or [n] ints; kv: [n, 2, nkv, hd]
        kvt = kv.transpose(1, 2, 0, 3)                                          # [2, nkv, n, hd]
        kind = self.dtype.scale
        if kind == "none":
            self.kv[layer][:, :, slots] = kvt
        elif kind == "per_token_head":
            self.kv[layer][:, :, slots], self.scale[layer][:, :, slots] = quantize_per_token_head(kvt)
        else:
            if self.scale[layer] is None:
                amax = np.maximum(np.abs(kvt).max(axis=(1, 2, 3)), 1e-6)
                self.scale[layer] = (amax / FP8_SCALE_DIVISOR).astype(F32).reshape(2, 1, 1, 1)
            fmax = F32(self.dtype.max_value)
            self.kv[layer][:, :, slots] = np.clip(kvt / self.scale[layer], -fmax, fmax)

    def read(self, layer: int, slots):  # -> float32 [2 (K, V), nkv, T, hd]
        kind = self.dtype.scale
        kv = gather(self.kv[layer], slots)
        if kind == "none":
            return kv if self.dtype.name == "auto" else kv.astype(F32)   # auto + slice: a view, no copy
        if kind == "per_token_head":
            return kv.astype(F32) * gather(self.scale[layer], slots)[..., None]
        return kv.astype(F32) * self.scale[layer]

    def copy_slots(self, src, dst) -> None:  # slices or [m] ints: the numbers of slots src into slots dst
        """K/V as stored, with their per-token scales: exactly what was written there. fp8's per-tensor scale
        belongs to no slot. Overlapping ints are safe: numpy gathers src before it writes."""
        per_token = self.scale if self.dtype.scale == "per_token_head" else []
        for a in itertools.chain(self.kv, per_token):
            a[:, :, dst] = a[:, :, src]
