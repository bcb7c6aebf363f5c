"""The Llama decoder (LlamaForCausalLM) as a chain of the ops in `ops.py`, with its backward pass.

`forward(params, cfg, ids, targets) -> loss, cache` and `backward(cache) -> grads` work on a batch
of training windows [B, T] at positions 0..T-1. Parameter names and shapes are those of
`engine.model.checkpoint.expected_shapes` (Hugging Face's), so a trained dict saves as a checkpoint as is.
Q/K/V and gate/up are multiplied as one fused matrix each (one matmul instead of three / two).
"""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig
from . import ops


def _layer_forward(x, p, pre, cfg, cos, sin, past=None):  # [B, T, C] -> [B, T, C], cache
    """past: for step s of a draft chain (heads.py), the keys (after RoPE) and values of the real entries
    and of steps 1..s-1 ([B, K, T, D] each, see ops.chain_attention_forward); `layer_kv(cache)` gives
    this layer's own."""
    B, T, C = x.shape
    H, K, D, I = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    eps = cfg.rms_norm_eps
    h, c_n1 = ops.rmsnorm_forward(x, p[pre + "input_layernorm.weight"], eps)
    wqkv = np.concatenate([p[pre + "self_attn.q_proj.weight"], p[pre + "self_attn.k_proj.weight"],
                           p[pre + "self_attn.v_proj.weight"]])  # [(H + 2K) D, C]
    qkv, c_qkv = ops.linear_forward(h, wqkv)  # [B, T, (H + 2K) D]
    q = qkv[..., :H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
    k = qkv[..., H * D:(H + K) * D].reshape(B, T, K, D).transpose(0, 2, 1, 3)  # [B, K, T, D]
    v = np.ascontiguousarray(qkv[..., (H + K) * D:].reshape(B, T, K, D).transpose(0, 2, 1, 3))
    q, c_rq = ops.rope_forward(q, cos, sin)
    k, c_rk = ops.rope_forward(k, cos, sin)
    k = np.ascontiguousarray(k)
    if past is None:
        a, c_att = ops.attention_forward(np.ascontiguousarray(q), k, v)
    else:
        a, c_att = ops.chain_attention_forward(q, past[0] + [k], past[1] + [v])
    y = a.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # heads concatenated
    o, c_o = ops.linear_forward(y, p[pre + "self_attn.o_proj.weight"])
    x = x + o
    h2, c_n2 = ops.rmsnorm_forward(x, p[pre + "post_attention_layernorm.weight"], eps)
    wgu = np.concatenate([p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"]])  # [2I, C]
    gu, c_gu = ops.linear_forward(h2, wgu)  # [B, T, 2I]
    m, c_sw = ops.swiglu_forward(gu[..., :I], gu[..., I:])
    d, c_d = ops.linear_forward(m, p[pre + "mlp.down_proj.weight"])
    x = x + d
    return x, (c_n1, c_qkv, c_rq, c_rk, c_att, c_o, c_n2, c_gu, c_sw, c_d, (k, v), past is not None)


def layer_kv(cache):  # -> this layer's keys (after RoPE) and values [B, K, T, D]
    return cache[10]


def _layer_backward(dx, cache, pre, cfg, g, dkv=None, dpast=None):  # dx [B, T, C] -> dx into the layer; fills g
    """dkv: gradients reaching this layer's keys and values from later chain steps (added here);
    dpast: [dk, dv] per earlier stream of `past`, which this layer's gradients are added to."""
    c_n1, c_qkv, c_rq, c_rk, c_att, c_o, c_n2, c_gu, c_sw, c_d, _, chain = cache
    H, K, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B, T, _ = dx.shape
    # MLP branch (the residual passes dx through unchanged)
    dm, g[pre + "mlp.down_proj.weight"] = ops.linear_backward(dx, c_d)
    dg, du = ops.swiglu_backward(dm, c_sw)
    dh2, dwgu = ops.linear_backward(np.concatenate([dg, du], -1), c_gu)
    I = dg.shape[-1]
    g[pre + "mlp.gate_proj.weight"], g[pre + "mlp.up_proj.weight"] = dwgu[:I], dwgu[I:]
    dxn, g[pre + "post_attention_layernorm.weight"] = ops.rmsnorm_backward(dh2, c_n2)
    dx = dx + dxn
    # attention branch
    dy, g[pre + "self_attn.o_proj.weight"] = ops.linear_backward(dx, c_o)
    da = dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # [B, H, T, D]
    if chain:
        dq, dks, dvs = ops.chain_attention_backward(da, c_att)
        for acc, dk, dv in zip(dpast, dks, dvs):
            acc[0] += dk
            acc[1] += dv
        dk, dv = dks[-1], dvs[-1]
    else:
        dq, dk, dv = ops.attention_backward(da, c_att)
    if dkv is not None:
        dk, dv = dk + dkv[0], dv + dkv[1]
    dq = ops.rope_backward(dq, c_rq)
    dk = ops.rope_backward(dk, c_rk)
    dqkv = np.concatenate([dq.transpose(0, 2, 1, 3).reshape(B, T, H * D),
                           dk.transpose(0, 2, 1, 3).reshape(B, T, K * D),
                           dv.transpose(0, 2, 1, 3).reshape(B, T, K * D)], -1)  # [B, T, (H + 2K) D]
    dh, dwqkv = ops.linear_backward(dqkv, c_qkv)
    g[pre + "self_attn.q_proj.weight"] = dwqkv[:H * D]
    g[pre + "self_attn.k_proj.weight"] = dwqkv[H * D:(H + K) * D]
    g[pre + "self_attn.v_proj.weight"] = dwqkv[(H + K) * D:]
    dxn, g[pre + "input_layernorm.weight"] = ops.rmsnorm_backward(dh, c_n1)
    return dx + dxn


def lm_head_weight(params, cfg: ModelConfig):
    return params["model.embed_tokens.weight"] if cfg.tie_word_embeddings else params["lm_head.weight"]


def forward(params, cfg: ModelConfig, ids, targets=None, hidden_targets=None, hidden_weight: float = 0.0,
            head_rows=None):
    """ids [B, T] -> (mean cross-entropy in nats if targets is given else logits [B, T, V], cache).

    targets: next tokens [B, T], or a teacher's next-token probabilities [B, T, V] (distillation), or its top-k
    (idx [B, T, k] columns of the logits, probabilities [B, T, k]; positions whose probabilities are all 0 do
    not count: ops.sparse_soft_cross_entropy_forward).
    head_rows: [Vh] distinct token ids; the LM head is then restricted to those rows (logits [B, T, Vh]), a
    softmax over a sampled vocabulary that keeps a large vocabulary's head affordable in training.
    Without targets the second value is the residual stream after each layer ([L] x [B, T, C]).
    hidden_targets: a teacher's residual streams (as above); the loss then adds hidden_weight x the mean
    over layers of the relative squared error mean((x - t)^2) / mean(t^2) (layer-wise distillation)."""
    B, T = ids.shape
    dtype = params["model.embed_tokens.weight"].dtype
    cos, sin = ops.rope_tables(T, cfg.head_dim, cfg.rope_theta, dtype)
    x, c_emb = ops.embedding_forward(ids, params["model.embed_tokens.weight"])
    layer_caches, hidden = [], []
    for layer in range(cfg.num_hidden_layers):
        x, c = _layer_forward(x, params, f"model.layers.{layer}.", cfg, cos, sin)
        layer_caches.append(c)
        hidden.append(x)
    h, c_nf = ops.rmsnorm_forward(x, params["model.norm.weight"], cfg.rms_norm_eps)
    head = lm_head_weight(params, cfg)
    logits, c_head = ops.linear_forward(h, head if head_rows is None else head[head_rows])  # [B, T, V or Vh]
    if targets is None:
        return logits, hidden
    if isinstance(targets, tuple):  # a teacher's top-k (distillation)
        idx, p = targets
        loss, c_ce = ops.sparse_soft_cross_entropy_forward(logits.reshape(B * T, -1), idx.reshape(B * T, -1),
                                                           p.reshape(B * T, -1))
        c_ce = ("sparse", c_ce)
    elif targets.ndim == 3:  # a teacher's probabilities [B, T, V] (distillation)
        loss, c_ce = ops.soft_cross_entropy_forward(logits.reshape(B * T, -1), targets.reshape(B * T, -1))
        c_ce = ("soft", c_ce)
    else:
        loss, c_ce = ops.cross_entropy_forward(logits.reshape(B * T, -1), targets.reshape(-1))
        c_ce = ("hard", c_ce)
    dhidden = None
    if hidden_targets is not None and hidden_weight:
        dhidden = []
        for x_l, t_l in zip(hidden, hidden_targets):
            d = x_l - t_l
            scale = hidden_weight / (len(hidden) * d.size * float(np.vdot(t_l, t_l) / t_l.size))
            loss = loss + scale * float(np.vdot(d, d))
            dhidden.append(d * (2 * scale))  # d loss / d x_l
    return loss, (c_emb, layer_caches, c_nf, c_head, c_ce, dhidden, (B, T), head_rows)


def backward(cache, cfg: ModelConfig):
    """Gradients of the mean loss for every parameter, as a dict with the parameter names."""
    c_emb, layer_caches, c_nf, c_head, c_ce, dhidden, (B, T), head_rows = cache
    g = {}
    kind, c_ce = c_ce
    ce_backward = {"soft": ops.soft_cross_entropy_backward, "sparse": ops.sparse_soft_cross_entropy_backward,
                   "hard": ops.cross_entropy_backward}[kind]
    dlogits = ce_backward(1.0, c_ce).reshape(B, T, -1)
    dh, dhead = ops.linear_backward(dlogits, c_head)
    if head_rows is not None:  # the rows not in the head get no gradient from it
        full = np.zeros((cfg.vocab_size, dhead.shape[1]), dhead.dtype)
        full[head_rows] = dhead
        dhead = full
    dx, g["model.norm.weight"] = ops.rmsnorm_backward(dh, c_nf)
    for layer in reversed(range(cfg.num_hidden_layers)):
        if dhidden is not None:      # the layer-wise distillation term of this layer's output
            dx = dx + dhidden[layer]
        dx = _layer_backward(dx, layer_caches[layer], f"model.layers.{layer}.", cfg, g)
    demb = ops.embedding_backward(dx, c_emb)
    if cfg.tie_word_embeddings:
        g["model.embed_tokens.weight"] = demb + dhead
    else:
        g["model.embed_tokens.weight"], g["lm_head.weight"] = demb, dhead
    return g
