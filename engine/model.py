"""A Llama-style decoder in numpy: RMSNorm, RoPE (rotate-half), grouped-query attention, SwiGLU.

One function, `forward`, runs n new tokens of one sequence at positions p0 .. p0+n-1 against a paged
KV cache and returns logits for every new position: prefill (n = prompt), decode (n = 1) and
speculative verification (n = k+1) are the same call. `forward_no_cache` recomputes the whole
sequence, as the seed article's baseline does.

Speed (decode is bound by numpy's ~1 us per call on small models, docs/benchmarks.md) shapes a few
choices, each exact up to float32 rounding:
- Q, K and V are one matmul, gate and up are one matmul (fused weights, built once in `Model`).
- The RMSNorm weights (and a factor sqrt(C), see `rms_norm`) are folded into the matrix that follows
  each norm: (x * g) @ W = x @ (g[:, None] * W).
- 1/sqrt(head_dim) is folded into the Q weights: RoPE is linear, so scaling before or after is the same.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig

F32 = np.float32


class ContextLengthError(ValueError):
    """A position beyond max_position_embeddings (the seed's 'position overflow')."""


@dataclass
class LayerWeights:
    w_qkv: np.ndarray      # [C, (nq + 2 nkv) hd], input norm and 1/sqrt(hd) folded in
    w_o: np.ndarray        # [nq hd, C]
    w_gate_up: np.ndarray  # [C, 2 I], post-attention norm folded in
    w_down: np.ndarray     # [I, C]


class Model:
    """Inference weights in the layout `forward` wants, built once from checkpoint weights."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        c, hd = cfg.hidden_size, cfg.head_dim
        nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        sqrt_c = np.sqrt(c)                          # see rms_norm
        self.embed = np.ascontiguousarray(weights["model.embed_tokens.weight"], F32)   # [V, C]
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            g1 = weights[p + "input_layernorm.weight"][:, None] * sqrt_c                # [C, 1]
            g2 = weights[p + "post_attention_layernorm.weight"][:, None] * sqrt_c
            wq = weights[p + "self_attn.q_proj.weight"].T * F32(1.0 / np.sqrt(hd))     # [C, nq hd]
            wk = weights[p + "self_attn.k_proj.weight"].T                               # [C, nkv hd]
            wv = weights[p + "self_attn.v_proj.weight"].T
            self.layers.append(LayerWeights(
                w_qkv=np.ascontiguousarray(g1 * np.concatenate([wq, wk, wv], axis=1), F32),
                w_o=np.ascontiguousarray(weights[p + "self_attn.o_proj.weight"].T, F32),
                w_gate_up=np.ascontiguousarray(g2 * np.concatenate(
                    [weights[p + "mlp.gate_proj.weight"].T, weights[p + "mlp.up_proj.weight"].T], axis=1), F32),
                w_down=np.ascontiguousarray(weights[p + "mlp.down_proj.weight"].T, F32),
            ))
        head = weights["model.embed_tokens.weight"] if cfg.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = np.ascontiguousarray(weights["model.norm.weight"][:, None] * sqrt_c * head.T, F32)
        self.q_dim, self.kv_dim = nq * hd, nkv * hd
        self.c_eps = F32(c * cfg.rms_norm_eps)      # see rms_norm
        self.cos, self.sin_signed = rope_tables(hd, cfg.max_position_embeddings, cfg.rope_theta)
        half = hd // 2
        self.rotate_half_index = np.r_[half:hd, 0:half]   # x[..., idx] * [-1.., +1..] = rotate_half(x)
        self.num_parameters = sum(int(w.size) for w in weights.values())
        # row counts (3..16: verification) whose products run faster in 4-row pieces for these shapes
        self.split_rows = measure_split_rows(self.layers[0].w_gate_up)


def rope_tables(head_dim: int, max_pos: int, theta: float):
    """cos and sign-folded sin tables [max_pos, hd] for rotate-half RoPE (Hugging Face's layout).

    rotate_half(x) = concat(-x[hd/2:], x[:hd/2]); with sin_signed = concat(-sin, sin) over the two halves,
    rotate_half(x) * sin == x[rotate_half_index] * sin_signed, one gather and one multiply.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # [hd/2]
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq                       # [P, hd/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=1).astype(F32)
    sin_signed = np.concatenate([-np.sin(ang), np.sin(ang)], axis=1).astype(F32)
    return cos, sin_signed


def matmul_rows(x, w):  # [n, C] @ [C, D] -> [n, D], in products of at most 4 rows (3 padded to 4)
    """OpenBLAS multiplies a few rows at a time very unevenly here: for a [192, 1024] weight, 3 rows cost
    ~3x one row but 4 rows ~1.5x, and 5-9 rows 3-7x (it repacks the whole weight for such shapes).
    Products of 4 rows keep verification cheap for models whose matrices are large enough;
    `Model` measures at build time whether this pays for its own shapes (`split_rows`)."""
    n = x.shape[0]
    out = np.empty((n, w.shape[1]), np.float32)
    for i in range(0, n, 4):
        xi = x[i:i + 4]
        if len(xi) == 3:
            out[i:i + 3] = (np.concatenate([xi, xi[-1:]]) @ w)[:3]
        else:
            np.matmul(xi, w, out=out[i:i + len(xi)])
    return out


def measure_split_rows(w, sizes=range(3, 17), repeats: int = 9) -> frozenset:
    """The row counts for which `matmul_rows` beats one product with this weight (medians, interleaved)."""
    rng = np.random.default_rng(0)
    faster = set()
    for n in sizes:
        x = rng.standard_normal((n, w.shape[0])).astype(np.float32)
        direct, split = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            np.matmul(x, w)
            direct.append(time.perf_counter() - t)
            t = time.perf_counter()
            matmul_rows(x, w)
            split.append(time.perf_counter() - t)
        if np.median(split) < 0.9 * np.median(direct):
            faster.add(n)
    return frozenset(faster)


def rms_norm(x, c_eps):  # [n, C] -> [n, C] times 1/sqrt(C): the weight g and sqrt(C) live in the next matmul
    # x / sqrt(mean(x^2) + eps) == sqrt(C) * x / sqrt(sum(x^2) + C eps)
    return x / np.sqrt(np.vecdot(x, x)[:, None] + c_eps)


def apply_rope_inplace(x, cos, sin_signed, rotate_half_index):  # [n, h, hd], [n, 1, hd] x2
    rotated = x.take(rotate_half_index, axis=-1)       # x * cos + rotate_half(x) * sin
    rotated *= sin_signed
    x *= cos
    x += rotated


def softmax_inplace(s):  # [..., T] -> [..., T]
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def attention(q, k, v, p0, causal=True):  # [n, nq, hd], [nkv, T, hd] x2, first new position -> [n, nq hd]
    """Causal grouped-query attention of n new queries against T = p0 + n keys.

    Query head j reads KV head j // (nq // nkv) (Hugging Face's repeat_kv order), so the g query heads
    of one KV head are one matrix product. Only the block of the n new columns needs the causal mask:
    the p0 cached positions are visible to every new query.
    """
    n, nq, hd = q.shape
    nkv, T, _ = k.shape
    g = nq // nkv
    if n == 1:                                                                     # decode: no mask
        s = q.reshape(nkv, g, hd) @ k.transpose(0, 2, 1)                           # [nkv, g, T]
        return (softmax_inplace(s) @ v).reshape(1, nq * hd)
    qg = q.reshape(n, nkv, g, hd).transpose(1, 0, 2, 3).reshape(nkv, n * g, hd)   # [nkv, n g, hd]
    s = (qg @ k.transpose(0, 2, 1)).reshape(nkv, n, g, T)                          # [nkv, n, g, T]
    if causal:  # False only for the teaching fault "no causal mask in verification"
        s[..., p0:] += causal_mask(n)[None, :, None, :]
    o = softmax_inplace(s).reshape(nkv, n * g, T) @ v                              # [nkv, n g, hd]
    return o.reshape(nkv, n, g, hd).transpose(1, 0, 2, 3).reshape(n, nq * hd)


_MASKS: dict[int, np.ndarray] = {}


def causal_mask(n):  # -> [n, n]: 0 on and below the diagonal, -inf above
    m = _MASKS.get(n)
    if m is None:
        m = _MASKS[n] = np.triu(np.full((n, n), -np.inf, F32), 1)
    return m


def forward(model: Model, tokens, p0: int, kv=None, causal: bool = True, last_only: bool = False):
    """Logits [n, V] for n new tokens at positions p0..p0+n-1 ([1, V] for the last one if last_only:
    a prefill needs no more, and the LM head is a large share of its work for a large vocabulary).

    kv: an object with `write(layer, kv)` storing this call's keys and values [n, 2, nkv, hd] and
    `read(layer) -> KV` returning them as [2, nkv, p0 + n, hd] float32 for the whole sequence so far
    (engine.kv_cache.SequenceKV reads through a block table). kv=None means no cache: this call
    must then cover the whole sequence (p0 = 0), and attention uses the keys it just computed.
    """
    cfg = model.cfg
    n = len(tokens)
    if p0 + n > cfg.max_position_embeddings:
        raise ContextLengthError(
            f"positions {p0}..{p0 + n - 1} exceed the model's context of "
            f"{cfg.max_position_embeddings} tokens (max_position_embeddings)")
    if kv is None and p0 != 0:
        raise ValueError("without a KV cache the whole sequence must be passed (p0 = 0)")
    nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_dim, qk_dim, i_dim = model.q_dim, model.q_dim + model.kv_dim, cfg.intermediate_size
    c_eps, idx = model.c_eps, model.rotate_half_index
    cos = model.cos[p0:p0 + n, None, :]                                            # [n, 1, hd]
    sin = model.sin_signed[p0:p0 + n, None, :]
    mm = matmul_rows if n in model.split_rows else operator.matmul                  # x @ w
    x = model.embed.take(tokens, axis=0)                                           # [n, C]
    for i, lw in enumerate(model.layers):
        qkv = mm(rms_norm(x, c_eps), lw.w_qkv)                                     # [n, (nq+2nkv) hd]
        apply_rope_inplace(qkv[:, :qk_dim].reshape(n, nq + nkv, hd), cos, sin, idx)
        q = qkv[:, :q_dim].reshape(n, nq, hd)
        new_kv = qkv[:, q_dim:].reshape(n, 2, nkv, hd)                             # K (roped) and V
        if kv is None:
            K, V = new_kv.transpose(1, 2, 0, 3)                                    # [nkv, n, hd] x2
        else:
            kv.write(i, new_kv)
            K, V = kv.read(i)                                                      # [nkv, p0+n, hd] x2
        x = x + mm(attention(q, K, V, p0, causal), lw.w_o)
        gate_up = mm(rms_norm(x, c_eps), lw.w_gate_up)                             # [n, 2 I]
        gate, up = gate_up[:, :i_dim], gate_up[:, i_dim:]
        x = x + mm(gate * up / (1.0 + np.exp(-gate)), lw.w_down)                   # SwiGLU: silu(g) u
    if last_only:
        return rms_norm(x[-1:], c_eps) @ model.lm_head                             # [1, V]
    return mm(rms_norm(x, c_eps), model.lm_head)                                   # [n, V]


def _slot_array(slots):  # a slice or int array of slots -> int array
    return np.arange(slots.start, slots.stop) if isinstance(slots, slice) else np.asarray(slots)


def forward_no_cache(model: Model, tokens):
    """The seed's baseline: recompute every position of the sequence; logits [T, V]."""
    return forward(model, np.asarray(tokens), 0, None)


def forward_batch(model: Model, requests):
    """Several sequences' new tokens in one computation (continuous batching).

    requests: [(tokens, p0, kv)], each as for `forward`. Every matrix product runs once over all rows
    of all sequences; only attention, which reads each sequence's own cache, runs per sequence.
    Returns [logits [n_i, V]] in request order; equal to calling `forward` on each.
    """
    cfg = model.cfg
    nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_dim, qk_dim, i_dim = model.q_dim, model.q_dim + model.kv_dim, cfg.intermediate_size
    c_eps, idx = model.c_eps, model.rotate_half_index
    sizes = [len(t) for t, _, _ in requests]
    for (t, p0, _), n in zip(requests, sizes):
        if p0 + n > cfg.max_position_embeddings:
            raise ContextLengthError(f"positions {p0}..{p0 + n - 1} exceed the model's context of "
                                     f"{cfg.max_position_embeddings} tokens (max_position_embeddings)")
    N = sum(sizes)
    bounds = np.cumsum([0] + sizes)
    positions = np.concatenate([np.arange(p0, p0 + n) for (_, p0, _), n in zip(requests, sizes)])
    cos, sin = model.cos[positions, None, :], model.sin_signed[positions, None, :]      # [N, 1, hd]
    x = model.embed.take(np.concatenate([np.asarray(t) for t, _, _ in requests]), axis=0)   # [N, C]
    # One write of all new K/V per layer when every sequence lives in the same store (the usual case).
    stores = {id(kv.store) for _, _, kv in requests}
    store = requests[0][2].store if len(stores) == 1 else None
    if store is not None:
        write_slots = np.concatenate([_slot_array(kv.write_slots) for _, _, kv in requests])
    for i, lw in enumerate(model.layers):
        qkv = rms_norm(x, c_eps) @ lw.w_qkv                                        # [N, (nq+2nkv) hd]
        apply_rope_inplace(qkv[:, :qk_dim].reshape(N, nq + nkv, hd), cos, sin, idx)
        if store is not None:
            store.write(i, write_slots, qkv[:, q_dim:].reshape(N, 2, nkv, hd))
        att = np.empty((N, q_dim), np.float32)
        for (_, p0, kv), a, b in zip(requests, bounds[:-1], bounds[1:]):
            if store is None:
                kv.write(i, qkv[a:b, q_dim:].reshape(b - a, 2, nkv, hd))
            K, V = kv.read(i)
            att[a:b] = attention(qkv[a:b, :q_dim].reshape(b - a, nq, hd), K, V, p0)
        x = x + att @ lw.w_o
        gate_up = rms_norm(x, c_eps) @ lw.w_gate_up
        gate, up = gate_up[:, :i_dim], gate_up[:, i_dim:]
        x = x + (gate * up / (1.0 + np.exp(-gate))) @ lw.w_down
    logits = rms_norm(x, c_eps) @ model.lm_head
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
