"""Forward/backward pairs for every op of the Llama architecture, in numpy (llm.c style).

Each op is `*_forward(...) -> out, cache` and `*_backward(dout, cache) -> grads`. Shapes use
B = batch, T = time, C = hidden size, H = query heads, K = key/value heads, D = head dim,
I = intermediate size, V = vocabulary. All math is float32 in training; the finite-difference test
runs the same functions in float64 (nothing here forces a dtype).
"""
from __future__ import annotations

import numpy as np


# --- embedding ---------------------------------------------------------------------------------
def embedding_forward(ids, w):  # [B, T] int, [V, C] -> [B, T, C]
    return w[ids], (ids, w.shape)


def embedding_backward(dout, cache):  # [B, T, C] -> dw [V, C]
    ids, shape = cache
    dw = np.zeros(shape, dout.dtype)
    np.add.at(dw, ids.ravel(), dout.reshape(-1, shape[1]))
    return dw


# --- linear (no bias; weight [out, in] as torch.nn.Linear) --------------------------------------
def linear_forward(x, w):  # [..., in], [out, in] -> [..., out]
    return x @ w.T, (x, w)


def linear_backward(dout, cache):  # [..., out] -> dx [..., in], dw [out, in]
    x, w = cache
    dx = dout @ w
    dw = dout.reshape(-1, dout.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    return dx, dw


# --- RMSNorm: out = x / sqrt(mean(x^2) + eps) * w -----------------------------------------------
def rmsnorm_forward(x, w, eps):  # [..., C], [C] -> [..., C]
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + x.dtype.type(eps))  # [..., 1]
    xhat = x * rstd
    return xhat * w, (xhat, rstd, w)


def rmsnorm_backward(dout, cache):  # [..., C] -> dx [..., C], dw [C]
    xhat, rstd, w = cache
    dw = (dout * xhat).reshape(-1, xhat.shape[-1]).sum(0)
    dxhat = dout * w
    # d/dx of x*rstd: rstd * (dxhat - xhat * mean(dxhat * xhat))
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dw


# --- RoPE, Hugging Face rotate-half layout --------------------------------------------------------
def rope_tables(T, D, theta, dtype=np.float32):  # -> cos, sin [T, D]
    inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # [D/2]
    ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    ang = np.concatenate([ang, ang], -1)  # [T, D]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rotate_half(x):  # [..., D] -> cat(-x2, x1)
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def rope_forward(x, cos, sin):  # [B, N, T, D], [T, D], [T, D] -> [B, N, T, D]
    return x * cos + rotate_half(x) * sin, (cos, sin)


def rope_backward(dout, cache):  # rotate_half is R with R^T = -R, so dx = dout*cos - R(dout*sin)
    cos, sin = cache
    return dout * cos - rotate_half(dout * sin)


# --- grouped-query causal self-attention ----------------------------------------------------------
_MASKS: dict = {}


def causal_mask(T, dtype):  # -> [T, T]: 0 on and below the diagonal, -inf above
    key = (T, np.dtype(dtype))
    if key not in _MASKS:
        _MASKS[key] = np.triu(np.full((T, T), -np.inf, dtype), 1)
    return _MASKS[key]


def attention_forward(q, k, v):  # [B, H, T, D], [B, K, T, D], [B, K, T, D] -> [B, H, T, D]
    """softmax(q k^T / sqrt(D) + causal mask) v, query head j reading kv head j // (H // K).

    The G = H // K query heads of a group are stacked along time so that one batched matmul per
    group does the work (no per-head loop and no copy of k, v). The [T, T] score arrays dominate
    the time at T = 512, so they are updated in place."""
    B, H, T, D = q.shape
    K = k.shape[1]
    G = H // K
    scale = q.dtype.type(1.0 / np.sqrt(D))
    qg = q.reshape(B, K, G * T, D) * scale  # heads of group kv are consecutive: [B, K, G*T, D]
    p = qg @ k.transpose(0, 1, 3, 2)  # scores [B, K, G*T, T]
    p5 = p.reshape(B, K, G, T, T)
    p5 += causal_mask(T, p.dtype)  # -inf above the diagonal
    p -= p.max(-1, keepdims=True)
    np.exp(p, out=p)
    p *= 1.0 / p.sum(-1, keepdims=True)
    out = p @ v  # [B, K, G*T, D]
    return out.reshape(B, H, T, D), (qg, k, v, p, out, scale)


def attention_backward(dout, cache):  # [B, H, T, D] -> dq, dk, dv
    qg, k, v, p, out, scale = cache
    B, K, GT, D = qg.shape
    H = dout.shape[1]
    dout = dout.reshape(B, K, GT, D)
    dv = p.transpose(0, 1, 3, 2) @ dout  # [B, K, T, D] (sums over the G heads of a group)
    ds = dout @ v.transpose(0, 1, 3, 2)  # dP [B, K, G*T, T]
    # softmax backward dS = P * (dP - rowsum(dP * P)); rowsum(dP * P) = rowsum(dout * out) (FlashAttention)
    ds -= (dout * out).sum(-1, keepdims=True)
    ds *= p  # masked entries have p = 0
    dq = (ds @ k) * scale
    dk = ds.transpose(0, 1, 3, 2) @ qg  # [B, K, T, D]; qg already holds the scale
    return dq.reshape(B, H, GT // (H // K), D), dk, dv


# --- attention of a draft chain's step (EAGLE-3's "training-time test") -----------------------------
def chain_attention_forward(q, ks, vs):  # [B, H, T, D], s + 1 x [B, K, T, D] each -> [B, H, T, D]
    """Attention of draft step s = len(ks) - 1 of chains started at every position, all at once.

    The query at position i belongs to the chain started from the real entry at i - s; as at drafting
    time it reads the real keys ks[0] at positions <= i - s, and the chain's own entry of step r
    (1 <= r <= s), which sits at position i - s + r in stream ks[r]. s = 0 is causal attention."""
    B, H, T, D = q.shape
    K, s = ks[0].shape[1], len(ks) - 1
    G = H // K
    scale = q.dtype.type(1.0 / np.sqrt(D))
    qg = q.reshape(B, K, G, T, D) * scale
    real = qg @ ks[0][:, :, None].transpose(0, 1, 2, 4, 3)                       # [B, K, G, T, T]
    real += np.triu(np.full((T, T), -np.inf, q.dtype), 1 - s)                    # keys p <= i - s
    k_sh = [_shift(ks[r], s - r) for r in range(1, s + 1)]                      # k_sh[i] = ks[r][i - s + r]
    v_sh = [_shift(vs[r], s - r) for r in range(1, s + 1)]
    diag = [(qg * k[:, :, None]).sum(-1, keepdims=True) for k in k_sh]          # [B, K, G, T, 1] each
    for r, d in enumerate(diag, 1):
        d[:, :, :, :s - r] = -np.inf                                             # the chain starts before 0
    p = np.concatenate([real] + diag, -1)                                        # [B, K, G, T, T + s]
    p -= p.max(-1, keepdims=True)
    np.exp(p, out=p)
    p *= 1.0 / p.sum(-1, keepdims=True)
    out = p[..., :T] @ vs[0][:, :, None]
    for r, v in enumerate(v_sh):
        out += p[..., T + r:T + r + 1] * v[:, :, None]
    return out.reshape(B, H, T, D), (qg, ks[0], vs[0], k_sh, v_sh, p, out, scale)


def chain_attention_backward(dout, cache):  # [B, H, T, D] -> dq, dks, dvs (as the forward's ks, vs)
    qg, k0, v0, k_sh, v_sh, p, out, scale = cache
    B, K, G, T, D = qg.shape
    s = len(k_sh)
    dout = dout.reshape(B, K, G, T, D)
    dp = np.concatenate([dout @ v0[:, :, None].transpose(0, 1, 2, 4, 3)]
                        + [(dout * v[:, :, None]).sum(-1, keepdims=True) for v in v_sh], -1)
    dp -= (dout * out).sum(-1, keepdims=True)
    dp *= p                                                                      # dS; masked entries have p = 0
    dq = dp[..., :T] @ k0[:, :, None]
    for r, k in enumerate(k_sh):
        dq += dp[..., T + r:T + r + 1] * k[:, :, None]
    dks = [(dp[..., :T].transpose(0, 1, 2, 4, 3) @ qg).sum(2)]
    dvs = [(p[..., :T].transpose(0, 1, 2, 4, 3) @ dout).sum(2)]
    for r in range(s):
        dks.append(_shift((dp[..., T + r:T + r + 1] * qg).sum(2), -(s - 1 - r)))
        dvs.append(_shift((p[..., T + r:T + r + 1] * dout).sum(2), -(s - 1 - r)))
    return (dq * scale).reshape(B, K * G, T, D), dks, dvs


def _shift(x, o):  # [B, K, T, D] -> y[:, :, i] = x[:, :, i - o] (zeros where out of range); o < 0 shifts back
    if o == 0:
        return x
    y = np.zeros_like(x)
    if o > 0:
        y[:, :, o:] = x[:, :, :-o]
    else:
        y[:, :, :o] = x[:, :, -o:]
    return y


# --- SwiGLU: silu(g) * u ------------------------------------------------------------------------
def swiglu_forward(g, u):  # [..., I], [..., I] -> [..., I]
    sig = 1.0 / (1.0 + np.exp(-g))
    sg = g * sig
    return sg * u, (g, u, sig, sg)


def swiglu_backward(dout, cache):  # -> dg, du
    g, u, sig, sg = cache
    du = dout * sg
    dg = dout * u * sig * (1.0 + g * (1.0 - sig))  # d silu(g)/dg = sig + g*sig*(1-sig)
    return dg, du


# --- cross-entropy over the vocabulary ---------------------------------------------------------
def cross_entropy_forward(logits, targets):  # [N, V], [N] -> mean loss (nats), cache
    m = logits.max(-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(-1, keepdims=True)
    logp = logits - m - np.log(z)
    n = targets.shape[0]
    loss = -logp[np.arange(n), targets].mean()
    return loss, (e / z, targets)


def cross_entropy_backward(dloss, cache):  # -> dlogits [N, V]
    probs, targets = cache
    n = targets.shape[0]
    d = probs.copy()
    d[np.arange(n), targets] -= 1.0
    return d * (d.dtype.type(dloss) / n)


def soft_cross_entropy_forward(logits, target_probs):  # [N, V], [N, V] -> mean -sum(p log q), cache
    """Distillation loss: cross-entropy against a teacher's distribution instead of one-hot labels."""
    m = logits.max(-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(-1, keepdims=True)
    logq = logits - m - np.log(z)
    loss = -(target_probs * logq).sum(-1).mean()
    return loss, (e / z, target_probs)


def soft_cross_entropy_backward(dloss, cache):  # -> dlogits [N, V] = (q - p) / N
    q, p = cache
    return (q - p) * (q.dtype.type(dloss) / q.shape[0])


def sparse_soft_cross_entropy_forward(logits, idx, p):  # [N, V], [N, k] int, [N, k] -> mean -sum_j p_j log q[idx_j]
    """Distillation from a teacher's top-k: p holds its k most probable tokens' probabilities, idx their columns
    of the logits (distinct within a row). Rows whose p is all zero (padding) do not count in the mean."""
    m = logits.max(-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(-1, keepdims=True)
    logq = np.take_along_axis(logits, idx, -1) - m - np.log(z)  # [N, k]
    n = max(1, int((p.sum(-1) > 0).sum()))
    loss = -(p * logq).sum() / n
    return loss, (e / z, idx, p, n)


def sparse_soft_cross_entropy_backward(dloss, cache):  # -> dlogits [N, V] = (q sum_j p_j - scatter(p)) / n
    q, idx, p, n = cache
    d = q * p.sum(-1, keepdims=True)
    d[np.arange(len(d))[:, None], idx] -= p  # idx distinct within a row: no accumulation needed
    return d * (d.dtype.type(dloss) / n)


# --- SiLU (Medusa's residual blocks) ---------------------------------------------------------------
def silu_forward(x):  # [...] -> x * sigmoid(x)
    sig = 1.0 / (1.0 + np.exp(-x))
    return x * sig, (x, sig)


def silu_backward(dout, cache):  # -> dx
    x, sig = cache
    return dout * sig * (1.0 + x * (1.0 - sig))


# --- smooth L1 (EAGLE's feature regression) ----------------------------------------------------------
def smooth_l1_forward(x, target):  # [N, C], [N, C] -> mean over elements of huber(x - target, 1)
    d = x - target
    a = np.abs(d)
    loss = np.where(a < 1.0, 0.5 * d * d, a - 0.5).mean()
    return loss, (d, a)


def smooth_l1_backward(dloss, cache):  # -> dx
    d, a = cache
    return np.where(a < 1.0, d, np.sign(d)) * (d.dtype.type(dloss) / d.size)
