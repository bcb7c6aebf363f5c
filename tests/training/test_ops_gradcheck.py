"""Every backward against central finite differences in float64 (relative error <= 1e-5)."""
import numpy as np
import pytest

from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.training import llama, ops

TOL = 1e-5


def numerical_grad(f, x, eps=1e-6):  # d sum(f() * w) / dx for the scalar function f
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * eps)
    return g


def rel_err(a, b):
    return np.abs(a - b).max() / max(np.abs(a).max(), np.abs(b).max(), 1e-12)


rng = np.random.default_rng(0)


def check(forward, backward, inputs, out_shape_of=None):
    """forward(*inputs) -> out, cache; loss = sum(out * w) for a fixed random w."""
    out, cache = forward(*inputs)
    w = rng.standard_normal(np.shape(out))
    grads = backward(w * 1.0, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for x, g in zip(inputs, grads):
        num = numerical_grad(lambda: float(np.sum(forward(*inputs)[0] * w)), x)
        assert rel_err(num, g) <= TOL, (forward.__name__, rel_err(num, g))


def test_linear():
    check(ops.linear_forward, ops.linear_backward, [rng.standard_normal((2, 3, 5)), rng.standard_normal((4, 5))])


def test_rmsnorm():
    check(lambda x, w: ops.rmsnorm_forward(x, w, 1e-5), ops.rmsnorm_backward,
          [rng.standard_normal((2, 3, 6)), rng.standard_normal(6)])


def test_rope():
    cos, sin = ops.rope_tables(5, 8, 10000.0, np.float64)
    x = rng.standard_normal((2, 3, 5, 8))
    check(lambda x: ops.rope_forward(x, cos, sin), ops.rope_backward, [x])


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_attention_grouped(kv_heads):
    q = rng.standard_normal((2, 4, 5, 6))
    k = rng.standard_normal((2, kv_heads, 5, 6))
    v = rng.standard_normal((2, kv_heads, 5, 6))
    check(ops.attention_forward, ops.attention_backward, [q, k, v])


def test_attention_matches_reference_loop():
    q, k, v = rng.standard_normal((1, 4, 5, 6)), rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((1, 2, 5, 6))
    out, _ = ops.attention_forward(q, k, v)
    for j in range(4):
        kv = j // 2
        s = q[0, j] @ k[0, kv].T / np.sqrt(6) + np.triu(np.full((5, 5), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(out[0, j], p @ v[0, kv], atol=1e-12)


def test_swiglu():
    check(ops.swiglu_forward, ops.swiglu_backward, [rng.standard_normal((3, 7)), rng.standard_normal((3, 7))])


def test_embedding():
    ids = np.array([[0, 2, 2], [1, 0, 3]])
    w = rng.standard_normal((5, 4))
    out, cache = ops.embedding_forward(ids, w)
    dout = rng.standard_normal(out.shape)
    num = numerical_grad(lambda: float(np.sum(ops.embedding_forward(ids, w)[0] * dout)), w)
    assert rel_err(num, ops.embedding_backward(dout, cache)) <= TOL


def test_cross_entropy():
    logits, targets = rng.standard_normal((6, 9)), rng.integers(0, 9, 6)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    num = numerical_grad(lambda: float(ops.cross_entropy_forward(logits, targets)[0]), logits)
    assert rel_err(num, ops.cross_entropy_backward(1.0, cache)) <= TOL


@pytest.mark.parametrize("kv_heads,tie", [(4, False), (2, False), (1, True)])
def test_whole_model(kv_heads, tie):
    cfg = ModelConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                      intermediate_size=24, vocab_size=11, tie_word_embeddings=tie)
    p = {k: v.astype(np.float64) for k, v in init_weights(cfg, seed=1, std=0.3).items()}
    for k in p:
        if k.endswith("norm.weight"):
            p[k] += rng.standard_normal(p[k].shape) * 0.1
    ids, tg = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    loss, cache = llama.forward(p, cfg, ids, tg)
    grads = llama.backward(cache, cfg)
    assert set(grads) == set(p)
    for name, x in p.items():
        num = numerical_grad(lambda: float(llama.forward(p, cfg, ids, tg)[0]), x)
        assert rel_err(num, grads[name]) <= TOL, name
        assert grads[name].dtype == np.float64


def test_whole_model_with_layerwise_distillation():
    """Soft targets plus the term matching a teacher's residual stream after every layer."""
    cfg = ModelConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                      intermediate_size=24, vocab_size=11)
    p = {k: v.astype(np.float64) for k, v in init_weights(cfg, seed=2, std=0.3).items()}
    ids = rng.integers(0, 11, (2, 6))
    probs = np.exp(rng.standard_normal((2, 6, 11)))
    probs /= probs.sum(-1, keepdims=True)
    hidden = [rng.standard_normal((2, 6, 16)) for _ in range(2)]
    loss, cache = llama.forward(p, cfg, ids, probs, hidden, 0.7)
    assert loss > llama.forward(p, cfg, ids, probs)[0]        # the term is there (and is positive)
    grads = llama.backward(cache, cfg)
    for name, x in p.items():
        num = numerical_grad(lambda: float(llama.forward(p, cfg, ids, probs, hidden, 0.7)[0]), x)
        assert rel_err(num, grads[name]) <= TOL, name


def test_float32_stays_float32():
    cfg = ModelConfig.from_name("ci-tiny")
    p = init_weights(cfg, seed=0)
    ids = rng.integers(0, cfg.vocab_size, (2, 8))
    loss, cache = llama.forward(p, cfg, ids, ids)
    grads = llama.backward(cache, cfg)
    assert loss.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())


def test_soft_cross_entropy():
    logits = rng.standard_normal((6, 9))
    p = np.exp(rng.standard_normal((6, 9)))
    p /= p.sum(-1, keepdims=True)
    loss, cache = ops.soft_cross_entropy_forward(logits, p)
    num = numerical_grad(lambda: float(ops.soft_cross_entropy_forward(logits, p)[0]), logits)
    assert rel_err(num, ops.soft_cross_entropy_backward(1.0, cache)) <= TOL
