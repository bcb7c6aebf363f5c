"""Draft heads' training math (EAGLE-1, Medusa-1) on a frozen target, with the backward pass.

Both read the target's last hidden state after its final norm without the norm's weight,
f = x / rms(x) [.., C] (engine.model.forward's with_hidden, times sqrt(C)), and end in the target's
own LM head restricted to a vocabulary subset S (FR-Spec): `head_w` = (g * E)[S] [Vs, C], frozen,
where g is the final norm weight and E the (tied) output embedding. The target's distribution
renormalised on S, softmax(f_{next} @ head_w.T), is the distillation target; it is computed from the
stored features, so no logits are stored.

EAGLE (Li et al. 2024): z = [f_t, emb(x_{t+1})] @ W_fc.T -> one Llama decoder layer -> h;
  f_hat = h / rms(h) predicts f_{t+1} (smooth L1) and f_hat @ head_w.T the token x_{t+2} (soft CE).
Medusa (Cai et al. 2024): head i = 1..K: r_i = f_t + SiLU(f_t @ W_i.T) (W_i starts at 0);
  r_i @ head_w.T predicts the token x_{t+1+i}, whose target distribution comes from f_{t+i}.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from . import llama, ops

LAYER = "model.layers.0."


def eagle_config(target: ModelConfig, vocab_size: int) -> ModelConfig:
    """One decoder layer of the target's shape over the subset vocabulary."""
    return target.replace(num_hidden_layers=1, vocab_size=vocab_size, tie_word_embeddings=True,
                          name=f"{target.name}-eagle")


def init_eagle(cfg: ModelConfig, rng, dtype=np.float32) -> dict:
    c, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def lin(out, inp, scale=1.0):
        return (rng.standard_normal((out, inp)) * scale / np.sqrt(inp)).astype(dtype)
    eye = np.concatenate([np.eye(c), 0.1 * rng.standard_normal((c, c)) / np.sqrt(c)], 1).astype(dtype)
    return {"fc.weight": eye,     # starts as "the feature itself, plus a little of the token"
            LAYER + "input_layernorm.weight": np.ones(c, dtype),
            LAYER + "self_attn.q_proj.weight": lin(nq * hd, c), LAYER + "self_attn.k_proj.weight": lin(nkv * hd, c),
            LAYER + "self_attn.v_proj.weight": lin(nkv * hd, c), LAYER + "self_attn.o_proj.weight": lin(c, nq * hd, 0.1),
            LAYER + "post_attention_layernorm.weight": np.ones(c, dtype),
            LAYER + "mlp.gate_proj.weight": lin(i, c), LAYER + "mlp.up_proj.weight": lin(i, c),
            LAYER + "mlp.down_proj.weight": lin(c, i, 0.1)}


def init_medusa(c: int, num_heads: int, dtype=np.float32) -> dict:
    return {f"medusa.{i}.weight": np.zeros((c, c), dtype) for i in range(num_heads)}


def _masked_rows(x, mask):  # [B, T, D], [B, T] bool -> [n, D]
    return x.reshape(-1, x.shape[-1])[mask.ravel()]


def _target_probs(f_next, head_w):  # [n, C], [Vs, C] -> softmax over the subset [n, Vs]
    z = f_next @ head_w.T
    z -= z.max(-1, keepdims=True)
    np.exp(z, out=z)
    return z / z.sum(-1, keepdims=True)


def eagle_forward(params, cfg: ModelConfig, f, e, f_next, mask, head_w, reg_weight: float = 1.0):
    """f [B, T, C] features at t, e [B, T, C] embeddings of x_{t+1}, f_next [B, T, C] features at t+1,
    mask [B, T] positions that count -> (loss, parts {ce, reg}, cache)."""
    B, T, C = f.shape
    cos, sin = ops.rope_tables(T, cfg.head_dim, cfg.rope_theta, f.dtype)
    z, c_fc = ops.linear_forward(np.concatenate([f, e], -1), params["fc.weight"])       # [B, T, C]
    h, c_layer = llama._layer_forward(z, params, LAYER, cfg, cos, sin)
    fh, c_norm = ops.rmsnorm_forward(h, np.ones(C, f.dtype), cfg.rms_norm_eps)          # f_hat [B, T, C]
    rows, nxt = _masked_rows(fh, mask), _masked_rows(f_next, mask)                       # [n, C]
    logits, c_head = ops.linear_forward(rows, head_w)                                    # [n, Vs]
    ce, c_ce = ops.soft_cross_entropy_forward(logits, _target_probs(nxt, head_w))
    reg, c_reg = ops.smooth_l1_forward(rows, nxt)
    loss = ce + reg_weight * reg
    return loss, {"ce": float(ce), "reg": float(reg)}, (c_fc, c_layer, c_norm, c_head, c_ce, c_reg, mask,
                                                          reg_weight, (B, T, C))


def eagle_backward(cache, cfg: ModelConfig) -> dict:
    c_fc, c_layer, c_norm, c_head, c_ce, c_reg, mask, reg_weight, (B, T, C) = cache
    drows, _ = ops.linear_backward(ops.soft_cross_entropy_backward(1.0, c_ce), c_head)   # head_w frozen
    drows = drows + ops.smooth_l1_backward(reg_weight, c_reg)
    dfh = np.zeros((B * T, C), drows.dtype)
    dfh[mask.ravel()] = drows
    dh, _ = ops.rmsnorm_backward(dfh.reshape(B, T, C), c_norm)
    g = {}
    dz = llama._layer_backward(dh, c_layer, LAYER, cfg, g)
    _, g["fc.weight"] = ops.linear_backward(dz, c_fc)
    return g


def medusa_forward(params, f, mask, head_w):
    """f [B, T + K, C] features; head i (1..K) reads positions 0..T-1 and is taught the target's distribution
    at i..i+T-1; mask [B, T] -> (loss: mean over heads, per-head losses, cache)."""
    K = len(params)
    B, T = mask.shape
    x = _masked_rows(f[:, :T], mask)                                                     # [n, C]
    p_all = _target_probs(f[:, 1:T + K].reshape(-1, f.shape[-1]), head_w).reshape(B, T + K - 1, -1)  # once for all heads
    losses, caches = [], []
    for i in range(K):
        a, c_lin = ops.linear_forward(x, params[f"medusa.{i}.weight"])
        s, c_silu = ops.silu_forward(a)
        logits, c_head = ops.linear_forward(x + s, head_w)
        ce, c_ce = ops.soft_cross_entropy_forward(logits, _masked_rows(p_all[:, i:i + T], mask))
        losses.append(float(ce))
        caches.append((c_lin, c_silu, c_head, c_ce))
    return sum(losses) / K, losses, caches


def medusa_backward(caches) -> dict:
    g = {}
    for i, (c_lin, c_silu, c_head, c_ce) in enumerate(caches):
        dr, _ = ops.linear_backward(ops.soft_cross_entropy_backward(1.0 / len(caches), c_ce), c_head)
        _, g[f"medusa.{i}.weight"] = ops.linear_backward(ops.silu_backward(dr, c_silu), c_lin)
    return g
