"""A Llama-style decoder in numpy: RMSNorm, RoPE (rotate-half), grouped-query attention, SwiGLU.

`forward` runs n new tokens of one sequence at positions p0 .. p0+n-1 against a paged KV cache and returns
logits for every new position: prefill (n = prompt), decode (n = 1) and speculative verification (n = k+1)
are the same call. `forward_batch` runs the new tokens of several sequences at once (continuous batching).
Both run the same layers, `decoder_layers`; they differ in how the rows' attention reads the caches.
`forward_no_cache` recomputes the whole sequence, as the seed article's baseline does.

Which new positions a new position sees is data, an [n, n] mask added to the attention scores: the causal
mask unless the caller passes another (a draft tree's; a teaching fault's, engine/spec_decode/faults.py).
So is the position RoPE rotates a new row by: p0 + i for row i unless the caller passes `positions`. A token
tree's verification is one `forward` over the root and its nodes with both: each node sees the committed
context and its own ancestors, at position root + depth, while its K/V take the next free slots (scratch
that engine/kv/cache.py's `keep_tree_path` turns into the accepted path).

Speed (a small model's decode step is bound by numpy's overhead per call, docs/benchmarks.md) shapes a few
choices, each exact up to float32 rounding:
- Q, K and V are one matmul, gate and up are one matmul (fused weights, built once in `Model`).
- The RMSNorm weights (and a factor sqrt(C), see `rms_norm`) are folded into the matrix that follows
  each norm: (x * g) @ W = x @ (g[:, None] * W).
- 1/sqrt(head_dim) is folded into the Q weights: RoPE is linear, so scaling before or after is the same.
- Q and K columns are stored with each rotated pair side by side, so RoPE is one complex multiply.
- The gate and down weights are stored negated, so SwiGLU needs no negation (see `swiglu`).
- Softmax is normalised after the product with V.
- A one-token step reads and writes its K/V in the cache's own arrays where the cache allows it
  (`sequence_attention`), and a few rows' products may run in 4-row pieces (`matmul_rows`).
"""
from __future__ import annotations

import itertools
import math
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
    w_gate_up: np.ndarray  # [C, 2 I], post-attention norm folded in; the gate half negated (see swiglu)
    w_down: np.ndarray     # [I, C], negated (see swiglu)


class Model:
    """Inference weights in the layout `forward` wants, built once from checkpoint weights."""
    # row counts whose products run as `matmul_rows`: measured where a model is loaded, for its shapes on this
    # machine (engine/model/layout.py, `choose_split_rows`); none until then
    split_rows: frozenset = frozenset()

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        c, hd = cfg.hidden_size, cfg.head_dim
        nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        sqrt_c = np.sqrt(c)                          # see rms_norm
        # Hugging Face's rotate-half RoPE rotates dims (j, j + hd/2) of a head together. Reordering the
        # query and key columns of each head to (0, hd/2, 1, hd/2 + 1, ...) puts every rotated pair side
        # by side, so RoPE becomes one complex multiply (see apply_rope_inplace); q . k is unchanged, as
        # both use the same order. Keys in the cache are stored in this order.
        half = hd // 2
        pair_order = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()
        self.embed = np.ascontiguousarray(weights["model.embed_tokens.weight"], F32)   # [V, C]
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            g1 = weights[p + "input_layernorm.weight"][:, None] * sqrt_c                # [C, 1]
            g2 = weights[p + "post_attention_layernorm.weight"][:, None] * sqrt_c
            wq = weights[p + "self_attn.q_proj.weight"].T * F32(1.0 / np.sqrt(hd))     # [C, nq hd]
            wk = weights[p + "self_attn.k_proj.weight"].T                               # [C, nkv hd]
            wq, wk = (w.reshape(c, -1, hd)[:, :, pair_order].reshape(c, -1) for w in (wq, wk))
            wv = weights[p + "self_attn.v_proj.weight"].T
            self.layers.append(LayerWeights(
                w_qkv=np.ascontiguousarray(g1 * np.concatenate([wq, wk, wv], axis=1), F32),
                w_o=np.ascontiguousarray(weights[p + "self_attn.o_proj.weight"].T, F32),
                w_gate_up=np.ascontiguousarray(g2 * np.concatenate(
                    [-weights[p + "mlp.gate_proj.weight"].T, weights[p + "mlp.up_proj.weight"].T], axis=1), F32),
                w_down=np.ascontiguousarray(-weights[p + "mlp.down_proj.weight"].T, F32),
            ))
        head = weights["model.embed_tokens.weight"] if cfg.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = np.ascontiguousarray(weights["model.norm.weight"][:, None] * sqrt_c * head.T, F32)
        self.q_dim, self.kv_dim = nq * hd, nkv * hd
        self.c_eps = F32(c * cfg.rms_norm_eps)      # see rms_norm
        self.rotation = rope_rotation(hd, cfg.max_position_embeddings, cfg.rope_theta)
        self.num_parameters = sum(int(w.size) for w in weights.values())
        # x @ w for rows [n, C]: np.dot is the same product with less overhead per call than @ (a ufunc in numpy
        # 2), which a small model's decode step shows; weights stored otherwise (engine/model/layout.py) bring
        # their own
        self.dot = np.dot
        self.layout = "arrays"       # [in, out] arrays; engine/model/layout.py's names otherwise


def rope_rotation(head_dim: int, max_pos: int, theta: float):  # -> [max_pos, hd/2] complex64
    """e^(i pos freq_j): RoPE rotates the pair (x_j, x_{j+hd/2}) = x_j + i x_{j+hd/2} by pos freq_j."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # [hd/2]
    return np.exp(1j * np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq).astype(np.complex64)


def matmul_rows(x, w):  # [n, C] @ [C, D] -> [n, D], in products of at most 4 rows (3 padded to 4)
    """OpenBLAS multiplies a few rows at a time very unevenly: for some weights, 3 rows or 5-9 rows cost several
    times one row while 4 rows cost little more than one (it repacks the whole weight for some shapes).
    Products of 4 rows keep verification cheap for models whose matrices are large enough; where a model is
    loaded, engine/model/layout.py measures whether this pays for its shapes (`Model.split_rows`)."""
    n = x.shape[0]
    out = np.empty((n, w.shape[1]), np.float32)
    for i in range(0, n, 4):
        xi = x[i:i + 4]
        if len(xi) == 3:
            out[i:i + 3] = (np.concatenate([xi, xi[-1:]]) @ w)[:3]
        else:
            np.matmul(xi, w, out=out[i:i + len(xi)])
    return out


def rms_norm(x, c_eps):  # [n, C] -> [n, C] times 1/sqrt(C): the weight g and sqrt(C) live in the next matmul
    # x / sqrt(mean(x^2) + eps) == sqrt(C) * x / sqrt(sum(x^2) + C eps)
    if len(x) == 1:  # one row (a decode step): scalar arithmetic in Python beats three array operations
        return x * (1.0 / math.sqrt(float(np.vdot(x, x)) + c_eps))
    return x / np.sqrt(np.vecdot(x, x)[:, None] + c_eps)


def rms_norm_vector(x, c_eps):  # [C] -> [C]: `rms_norm` of one vector
    return x * (1.0 / math.sqrt(float(np.dot(x, x)) + c_eps))


def apply_rope_inplace(x, rotation):  # [n, h, hd] float32 in pair order (see Model), [n, 1, hd/2] complex64
    pairs = x.view(np.complex64)
    np.multiply(pairs, rotation, out=pairs)


def swiglu(neg_gate, up):  # -(silu(gate) * up), from -gate: the signs live in the weights (Model)
    # silu(g) u = g u / (1 + e^-g) = -(n u / (1 + e^n)) with n = -g: the gate weights are stored negated so
    # that the product gives n with no negation, and the down projection negated to undo the sign.
    e = np.exp(neg_gate)
    e += 1.0
    h = neg_gate * up
    h /= e
    return h


def softmax_weighted_sum(s, v):  # scores [nkv, r, T] (overwritten), v [nkv, T, hd] -> softmax(s) @ v [nkv, r, hd]
    # Normalising after the product with V divides hd numbers per row instead of T.
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    o = s @ v
    o /= s.sum(axis=-1, keepdims=True)
    return o


def attention(q, k, v, p0, mask=None):  # [n, nq, hd], [nkv, T, hd] x2, first new position, [n, n] -> [n, nq hd]
    """Grouped-query attention of n new queries against T = p0 + n keys.

    Query head j reads KV head j // (nq // nkv) (Hugging Face's repeat_kv order), so the g query heads
    of one KV head are one matrix product. The p0 cached positions are visible to every new query; among
    the n new ones, `mask` (added to the scores: 0 visible, -inf hidden) says which each query sees, the
    causal mask when None.
    """
    n, nq, hd = q.shape
    nkv, T, _ = k.shape
    g = nq // nkv
    if n == 1:                                                                     # decode: sees everything
        # K [T, hd] @ q.T rather than q @ K.T: OpenBLAS runs a product with a transposed [T, hd]
        # operand much slower; the copy that puts the scores back in [g, T] order is small.
        if g == 1:   # MHA: q as [nkv, hd, 1] is a plain reshape, and scores [T, 1] are already [1, T]
            s = (k @ q.reshape(nkv, hd, 1)).reshape(nkv, 1, T)
        else:
            s = np.ascontiguousarray((k @ q.reshape(nkv, g, hd).transpose(0, 2, 1)).transpose(0, 2, 1))
        return softmax_weighted_sum(s, v).reshape(1, nq * hd)                       # s: [nkv, g, T]
    if n * g <= 16 and T >= 256:
        # A few query rows against many keys (verification late in a long context): q K^T with the
        # transposed [T, hd] operand takes a slow OpenBLAS path here beyond a few hundred keys; K q^T plus
        # a small transposed copy does not.
        qgt = q.reshape(n, nkv, g, hd).transpose(1, 3, 0, 2).reshape(nkv, hd, n * g)   # [nkv, hd, n g]
        s = np.ascontiguousarray((k @ qgt).transpose(0, 2, 1)).reshape(nkv, n, g, T)
    else:
        qg = q.reshape(n, nkv, g, hd).transpose(1, 0, 2, 3).reshape(nkv, n * g, hd)   # [nkv, n g, hd]
        s = (qg @ k.transpose(0, 2, 1)).reshape(nkv, n, g, T)                          # [nkv, n, g, T]
    s[..., p0:] += (causal_mask(n) if mask is None else mask)[None, :, None, :]
    o = softmax_weighted_sum(s.reshape(nkv, n * g, T), v)                          # [nkv, n g, hd]
    return o.reshape(nkv, n, g, hd).transpose(1, 0, 2, 3).reshape(n, nq * hd)


_MASKS: dict[int, np.ndarray] = {}


def causal_mask(n):  # -> [n, n]: 0 on and below the diagonal, -inf above
    m = _MASKS.get(n)
    if m is None:
        m = _MASKS[n] = np.triu(np.full((n, n), -np.inf, F32), 1)
    return m


def forward(model: Model, tokens, p0: int, kv=None, *, mask=None, positions=None, last_only: bool = False,
            with_hidden: bool = False, inputs_embeds=None):
    """Logits [n, V] for n new tokens of one sequence at positions p0..p0+n-1 ([1, V] for the last one if
    last_only: a prefill needs no more, and the LM head is a large share of its work for a large vocabulary).

    kv: an object with `write(layer, kv)` storing this call's keys and values [n, 2, nkv, hd] and
    `read(layer) -> KV` returning them as [2, nkv, p0 + n, hd] float32 for the whole sequence so far
    (engine.kv.cache.SequenceKV reads through a block table). kv=None means no cache: this call
    must then cover the whole sequence (p0 = 0), and attention uses the keys it just computed.
    mask: [n, n], which new positions each new position sees (`attention`); None: the causal mask.
    positions: [n] the new rows' positions for RoPE (a token tree's: root + depth); None: p0 .. p0+n-1. Their
    K/V go to the slots of p0 .. p0+n-1 all the same: the mask, not the slot, says who sees whom.
    with_hidden: return (logits, hidden [n, C]) where hidden is the last hidden state of every new position
    after the final norm, as `rms_norm` leaves it (x / |x|, the norm weight lives in the LM head): what draft
    heads (engine/spec_decode/heads.py) read. It is computed on the way to the logits anyway.
    inputs_embeds: [n, C], the first layer's input instead of the tokens' embeddings (an EAGLE head's).
    """
    n = len(tokens)
    check_positions(model, p0, n)
    if kv is None and p0 != 0:
        raise ValueError("without a KV cache the whole sequence must be passed (p0 = 0)")
    x = model.embed.take(tokens, axis=0) if inputs_embeds is None else np.array(inputs_embeds, F32)   # [n, C]
    rotation = model.rotation[p0:p0 + n, None, :] if positions is None else rotation_at(model, positions, n)
    hidden = decoder_layers(model, x, rotation, sequence_attention(model, p0, kv, mask, n))
    rows = hidden[-1:] if last_only else hidden
    logits = products(model, len(rows))(rows, model.lm_head)                       # [n or 1, V]
    return (logits, hidden) if with_hidden else logits


def forward_no_cache(model: Model, tokens):
    """The seed's baseline: recompute every position of the sequence; logits [T, V]."""
    return forward(model, np.asarray(tokens), 0, None)


def forward_batch(model: Model, requests, last_only=None, with_hidden: bool = False):
    """Several sequences' new tokens in one computation (continuous batching).

    requests: [(tokens, p0, kv)], each as for `forward` (the causal mask). Every matrix product runs once over
    all rows of all sequences; only attention, which reads each sequence's own cache, runs per sequence.
    Returns [logits [n_i, V]] in request order ([1, V] for a request whose `last_only` is true: a prefill chunk
    needs no more), or [(logits, hidden [n_i, C])] with_hidden, as `forward`; equal to calling `forward` on each
    up to float32 rounding (products over other row counts sum in another order).
    """
    sizes = [len(t) for t, _, _ in requests]
    for (_, p0, _), n in zip(requests, sizes):
        check_positions(model, p0, n)
    positions = np.concatenate([np.arange(p0, p0 + n) for (_, p0, _), n in zip(requests, sizes)])
    x = model.embed.take(np.concatenate([np.asarray(t) for t, _, _ in requests]), axis=0)   # [N, C]
    hidden = decoder_layers(model, x, model.rotation[positions, None, :], batch_attention(model, requests, sizes))
    bounds = list(itertools.accumulate(sizes, initial=0))
    rows = list(zip(bounds, bounds[1:]))
    spans = [(b - 1 if last else a, b) for (a, b), last in zip(rows, last_only or [False] * len(requests))]
    if all(b - a == n for (a, b), n in zip(spans, sizes)):
        logits = products(model, len(hidden))(hidden, model.lm_head)              # [N, V]
    else:
        picked = np.concatenate([hidden[a:b] for a, b in spans])
        logits = products(model, len(picked))(picked, model.lm_head)
        kept = list(itertools.accumulate((b - a for a, b in spans), initial=0))
        spans = list(zip(kept, kept[1:]))
    if with_hidden:
        return [(logits[a:b], hidden[c:d]) for (a, b), (c, d) in zip(spans, rows)]
    return [logits[a:b] for a, b in spans]


def check_positions(model: Model, p0: int, n: int) -> None:
    if p0 + n > model.cfg.max_position_embeddings:
        raise ContextLengthError(f"positions {p0}..{p0 + n - 1} exceed the model's context of "
                                 f"{model.cfg.max_position_embeddings} tokens (max_position_embeddings)")


def rotation_at(model: Model, positions, n: int):  # [n] ints -> [n, 1, hd/2] complex64: RoPE at those positions
    positions = np.asarray(positions)
    if positions.shape != (n,) or positions.dtype.kind not in "iu":
        raise ValueError(f"positions must be {n} integers, one per new token, got shape {positions.shape}")
    if n and not 0 <= positions.min() <= positions.max() < model.cfg.max_position_embeddings:
        raise ContextLengthError(f"positions {positions.min()}..{positions.max()} are outside the model's context "
                                 f"of {model.cfg.max_position_embeddings} tokens (max_position_embeddings)")
    return model.rotation[positions, None, :]


def products(model: Model, n: int):  # -> x @ w for x of n rows
    return matmul_rows if n in model.split_rows else model.dot


def decoder_layers(model: Model, x, rotation, attend):  # [N, C] (updated in place) -> [N, C] after the final norm
    """The decoder's layers over N new rows, of one sequence or of many. rotation [N, 1, hd/2]: RoPE at each
    row's position; attend(layer, qkv) -> [N, nq hd]: the rows' attention, given the layer's projected heads
    qkv [N, (nq + 2 nkv) hd], RoPE applied to q and k (it stores the new K/V in the rows' caches)."""
    cfg = model.cfg
    nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qk_dim, i_dim, c_eps = model.q_dim + model.kv_dim, cfg.intermediate_size, model.c_eps
    n = len(x)
    mm = products(model, n)                                                        # x @ w
    for i, lw in enumerate(model.layers):
        qkv = mm(rms_norm(x, c_eps), lw.w_qkv)                                     # [N, (nq + 2 nkv) hd]
        apply_rope_inplace(qkv[:, :qk_dim].reshape(n, nq + nkv, hd), rotation)    # q and k heads
        x += mm(attend(i, qkv), lw.w_o)
        gate_up = mm(rms_norm(x, c_eps), lw.w_gate_up)                             # [N, 2 I]
        x += mm(swiglu(gate_up[:, :i_dim], gate_up[:, i_dim:]), lw.w_down)
    return rms_norm(x, c_eps)


def sequence_attention(model: Model, p0: int, kv, mask, n: int):  # -> attend(layer, qkv) for `decoder_layers`
    """One sequence's n new rows against its K/V: this call's K/V stored in its cache, then all of it read back
    (kv None: no cache, the keys just computed)."""
    cfg = model.cfg
    nq, nkv, hd, q_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, model.q_dim
    # A one-token step writes and reads its K/V in the store's own arrays where the cache allows it: a decode
    # step of a small model is mostly numpy's per-call overhead, and the store's write and read add calls.
    direct = kv.direct() if n == 1 and kv is not None else None

    def attend(layer: int, qkv):  # [n, (nq + 2 nkv) hd] -> [n, nq hd]
        if direct is not None:
            arrays, slot, held = direct
            a = arrays[layer]                                                      # [2, nkv, slots, hd]
            a[:, :, slot] = qkv[0, q_dim:].reshape(2, nkv, hd)
            K, V = a[0, :, held], a[1, :, held]                                    # [nkv, p0 + 1, hd] x2
        elif kv is None:
            K, V = qkv[:, q_dim:].reshape(n, 2, nkv, hd).transpose(1, 2, 0, 3)     # [nkv, n, hd] x2
        else:
            kv.write(layer, qkv[:, q_dim:].reshape(n, 2, nkv, hd))                 # K (roped) and V
            K, V = kv.read(layer)                                                  # [nkv, p0 + n, hd] x2
        return attention(qkv[:, :q_dim].reshape(n, nq, hd), K, V, p0, mask)
    return attend


def batch_attention(model: Model, requests, sizes):  # -> attend(layer, qkv) for `decoder_layers`
    """Each sequence's rows against its own K/V, the new K/V of all written at once when they share a store
    (the usual batch: one model's pool)."""
    cfg = model.cfg
    nq, nkv, hd, q_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, model.q_dim
    bounds = list(itertools.accumulate(sizes, initial=0))
    store = requests[0][2].store if len({id(kv.store) for _, _, kv in requests}) == 1 else None
    if store is not None:
        write_slots = np.concatenate([_slot_array(kv.write_slots) for _, _, kv in requests])

    def attend(layer: int, qkv):  # [N, (nq + 2 nkv) hd] -> [N, nq hd]
        if store is not None:
            store.write(layer, write_slots, qkv[:, q_dim:].reshape(len(qkv), 2, nkv, hd))
        att = np.empty((len(qkv), q_dim), np.float32)
        for (_, p0, kv), a, b in zip(requests, bounds, bounds[1:]):
            if store is None:
                kv.write(layer, qkv[a:b, q_dim:].reshape(b - a, 2, nkv, hd))
            K, V = kv.read(layer)                                                  # [nkv, p0 + n, hd] x2
            att[a:b] = attention(qkv[a:b, :q_dim].reshape(b - a, nq, hd), K, V, p0)
        return att
    return attend


def _slot_array(slots):  # a slice or int array of slots -> int array
    return np.arange(slots.start, slots.stop) if isinstance(slots, slice) else np.asarray(slots)
