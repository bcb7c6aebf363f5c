"""A deliberately straightforward implementation, in the seed article's style.

Per-head loops, separate Q/K/V matmuls, unfused norms, a dense preallocated cache. It exists for two
reasons: tests check the lean `engine.model.llama.forward` against an independent implementation, and
`bench engine` uses it as the baseline row, so that no speed-up ever comes from a slow baseline.
"""
from __future__ import annotations

import numpy as np

from .config import ModelConfig


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, theta):  # [n, hd]
    hd = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = positions[:, None] * inv_freq
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1).astype(np.float32)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1).astype(np.float32)
    return x * cos + rotate_half(x) * sin


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class DenseKVCache:
    """K and V per layer preallocated to the full context: [nkv, max_pos, hd]; length n in use."""

    def __init__(self, cfg: ModelConfig):
        shape = (cfg.num_key_value_heads, cfg.max_position_embeddings, cfg.head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in range(cfg.num_hidden_layers)]
        self.v = [np.zeros(shape, np.float32) for _ in range(cfg.num_hidden_layers)]
        self.n = 0


def forward(cfg: ModelConfig, w: dict, tokens, cache: DenseKVCache):
    tokens = list(tokens)
    n, p0 = len(tokens), cache.n
    T = p0 + n
    nq, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    positions = np.arange(p0, T)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        heads = []
        for kvh in range(nkv):
            kh = rope(k[:, kvh * hd:(kvh + 1) * hd], positions, cfg.rope_theta)
            cache.k[layer][kvh, p0:T] = kh
            cache.v[layer][kvh, p0:T] = v[:, kvh * hd:(kvh + 1) * hd]
        for qh in range(nq):
            kvh = qh // (nq // nkv)
            qq = rope(q[:, qh * hd:(qh + 1) * hd], positions, cfg.rope_theta)
            scores = qq @ cache.k[layer][kvh, :T].T / np.sqrt(hd)
            mask = np.triu(np.full((n, T), -1e9, np.float32), p0 + 1)
            heads.append(softmax(scores + mask) @ cache.v[layer][kvh, :T])
        x = x + np.concatenate(heads, axis=-1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    cache.n = T
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps) @ head.T
