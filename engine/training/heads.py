"""Draft heads' training math (EAGLE-1, Medusa-1) on a frozen target, with the backward pass.

Both read the target's last hidden state after its final norm without the norm's weight,
f = x / rms(x) [.., C] (engine.model.llama.forward's with_hidden, times sqrt(C)), and end in the target's
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

from ..model.config import ModelConfig
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


def eagle_unroll(params, cfg: ModelConfig, f, e, depth: int):
    """The head's predicted features at each draft step (see eagle_forward): yields (f_hat [B, T, C], cache)."""
    B, T, C = f.shape
    cos, sin = ops.rope_tables(T, cfg.head_dim, cfg.rope_theta, f.dtype)
    ks, vs, inp = [], [], f
    for s in range(depth):
        z, c_fc = ops.linear_forward(np.concatenate([inp, e], -1), params["fc.weight"])   # [B, T, C]
        h, c_layer = llama._layer_forward(z, params, LAYER, cfg, cos, sin, past=(ks, vs) if s else None)
        k, v = llama.layer_kv(c_layer)
        ks, vs = ks + [k], vs + [v]
        fh, c_norm = ops.rmsnorm_forward(h, np.ones(C, f.dtype), cfg.rms_norm_eps)      # f_hat [B, T, C]
        yield fh, (c_fc, c_layer, c_norm)
        inp = np.zeros_like(fh)
        inp[:, 1:] = fh[:, :-1]                                                          # the next step's input at i


def eagle_forward(params, cfg: ModelConfig, f, e, f_next, mask, head_w, reg_weight: float = 1.0, depth: int = 1,
                  step_decay: float = 0.8):
    """f [B, T, C] features at t, e [B, T, C] embeddings of x_{t+1}, f_next [B, T, C] features at t+1,
    mask [B, T] positions that count -> (loss, parts {ce, reg} per step, cache).

    depth > 1 unrolls drafting as EAGLE-3's training-time test: step s (0-based) at position i is the
    (s+1)-th draft of the chain started from the real feature at i - s. Its input is the feature the
    previous step predicted at i - 1 (with the true token: a chain only goes on when its drafts were
    right), its attention reads what the drafting cache would hold (ops.chain_attention_forward), and its
    targets are position i's, as at step 0. Step s's loss has weight step_decay^s (normalised to sum 1);
    gradients flow through the predicted features and keys of earlier steps."""
    B, T, C = f.shape
    w = np.array([step_decay ** s for s in range(depth)]) / sum(step_decay ** s for s in range(depth))
    nxt_all = _masked_rows(f_next, mask)                                                 # [n, C]
    p_all = _target_probs(nxt_all, head_w)                                               # [n, Vs], once for all steps
    steps, parts, loss = [], {"ce": [], "reg": []}, 0.0
    for s, (fh, c_step) in enumerate(eagle_unroll(params, cfg, f, e, depth)):
        m = mask & (np.arange(T) >= s)                                                   # the chain starts at i - s >= 0
        keep = m[mask]                                                                   # step s's rows among mask's
        rows = _masked_rows(fh, m)                                                       # [n_s, C]
        logits, c_head = ops.linear_forward(rows, head_w)                                # [n_s, Vs]
        ce, c_ce = ops.soft_cross_entropy_forward(logits, p_all[keep])
        reg, c_reg = ops.smooth_l1_forward(rows, nxt_all[keep])
        loss = loss + w[s] * (ce + reg_weight * reg)
        parts["ce"].append(float(ce))
        parts["reg"].append(float(reg))
        steps.append((*c_step, c_head, c_ce, c_reg, m, w[s]))
    return loss, parts, (steps, reg_weight, (B, T, C), llama.layer_kv(steps[0][1])[0])


def eagle_backward(cache, cfg: ModelConfig) -> dict:
    steps, reg_weight, (B, T, C), k0 = cache
    dkv = [(np.zeros_like(k0), np.zeros_like(k0)) for _ in steps]                   # from later steps' attention
    g, dinp = {}, None
    for s in reversed(range(len(steps))):
        c_fc, c_layer, c_norm, c_head, c_ce, c_reg, m, w = steps[s]
        drows, _ = ops.linear_backward(ops.soft_cross_entropy_backward(w, c_ce), c_head)  # head_w frozen
        drows = drows + ops.smooth_l1_backward(w * reg_weight, c_reg)
        dfh = np.zeros((B * T, C), drows.dtype)
        dfh[m.ravel()] = drows
        dfh = dfh.reshape(B, T, C)
        if dinp is not None:
            dfh[:, :-1] += dinp[:, 1:]
        dh, _ = ops.rmsnorm_backward(dfh, c_norm)
        gs = {}
        dz = llama._layer_backward(dh, c_layer, LAYER, cfg, gs, dkv=dkv[s], dpast=[list(d) for d in dkv[:s]])
        dcat, gs["fc.weight"] = ops.linear_backward(dz, c_fc)
        dinp = dcat[..., :C]
        for k, v in gs.items():
            g[k] = g[k] + v if k in g else v
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
