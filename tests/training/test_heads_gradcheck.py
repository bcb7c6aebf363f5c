"""The draft heads' new ops and whole losses (EAGLE, Medusa) against central finite differences in float64."""
import numpy as np
import pytest

from engine.model.config import ModelConfig
from engine.training import heads, ops
from tests.training.test_ops_gradcheck import TOL, check, numerical_grad, rel_err

rng = np.random.default_rng(1)


def test_silu():
    check(ops.silu_forward, ops.silu_backward, [rng.standard_normal((3, 7))])


def test_smooth_l1_both_branches():
    x = rng.standard_normal((4, 5)) * 2          # |d| above and below 1
    t = rng.standard_normal((4, 5))
    loss, cache = ops.smooth_l1_forward(x, t)
    g = ops.smooth_l1_backward(1.0, cache)
    assert rel_err(numerical_grad(lambda: float(ops.smooth_l1_forward(x, t)[0]), x), g) <= TOL


def _chain_reference(q, ks, vs):
    """Step s's attention written out per query: the real keys at positions <= i - s, then the chain's own
    entries of steps 1..s at positions i - s + r."""
    B, H, T, D = q.shape
    K, s = ks[0].shape[1], len(ks) - 1
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kv = h // (H // K)
            for i in range(T):
                keys = [ks[0][b, kv, p] for p in range(i - s + 1)]
                vals = [vs[0][b, kv, p] for p in range(i - s + 1)]
                keys += [ks[r][b, kv, i - s + r] for r in range(1, s + 1) if i - s + r >= 0]
                vals += [vs[r][b, kv, i - s + r] for r in range(1, s + 1) if i - s + r >= 0]
                a = np.array(keys) @ q[b, h, i] / np.sqrt(D)
                a = np.exp(a - a.max())
                out[b, h, i] = (a / a.sum()) @ np.array(vals)
    return out


def test_chain_attention_is_what_drafting_reads():
    B, H, K, T, D = 2, 4, 2, 6, 3
    q = rng.standard_normal((B, H, T, D))
    ks = [rng.standard_normal((B, K, T, D)) for _ in range(3)]
    vs = [rng.standard_normal((B, K, T, D)) for _ in range(3)]
    assert np.allclose(ops.chain_attention_forward(q, ks[:1], vs[:1])[0], ops.attention_forward(q, ks[0], vs[0])[0])
    for s in (1, 2):
        assert np.allclose(ops.chain_attention_forward(q, ks[:s + 1], vs[:s + 1])[0],
                           _chain_reference(q, ks[:s + 1], vs[:s + 1]))


def test_chain_attention_gradients():
    B, H, K, T, D = 1, 4, 2, 5, 3
    q = rng.standard_normal((B, H, T, D))
    ks = [rng.standard_normal((B, K, T, D)) for _ in range(3)]
    vs = [rng.standard_normal((B, K, T, D)) for _ in range(3)]
    w = rng.standard_normal((B, H, T, D))

    def loss():
        return float(np.sum(ops.chain_attention_forward(q, ks, vs)[0] * w))
    dq, dks, dvs = ops.chain_attention_backward(w, ops.chain_attention_forward(q, ks, vs)[1])
    assert rel_err(numerical_grad(loss, q), dq) <= TOL
    for x, g in zip(ks + vs, dks + dvs):
        assert rel_err(numerical_grad(loss, x), g) <= TOL


CFG = ModelConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=12, vocab_size=11)


@pytest.mark.parametrize("depth", [1, 3])
def test_eagle_loss_gradients(depth):
    """depth 3: the unrolled draft chain (training-time test), gradients through predicted features and keys."""
    B, T, C = 2, 5, CFG.hidden_size
    params = {k: v.astype(np.float64) for k, v in heads.init_eagle(CFG, rng).items()}
    params["fc.weight"] += 0.3 * rng.standard_normal(params["fc.weight"].shape)   # off the identity start
    f, e, f_next = (rng.standard_normal((B, T, C)) for _ in range(3))
    mask = rng.random((B, T)) < 0.7
    head_w = rng.standard_normal((CFG.vocab_size, C))

    def loss():
        return heads.eagle_forward(params, CFG, f, e, f_next, mask, head_w, reg_weight=0.5, depth=depth)[0]
    _, _, cache = heads.eagle_forward(params, CFG, f, e, f_next, mask, head_w, reg_weight=0.5, depth=depth)
    grads = heads.eagle_backward(cache, CFG)
    assert grads.keys() == params.keys()
    for name, w in params.items():
        assert rel_err(numerical_grad(loss, w), grads[name]) <= TOL, name


def test_medusa_loss_gradients():
    K, B, T, C = 3, 2, 4, 8
    params = {k: 0.5 * rng.standard_normal(v.shape) for k, v in heads.init_medusa(C, K, np.float64).items()}
    f = rng.standard_normal((B, T + K, C))
    mask = rng.random((B, T)) < 0.8
    head_w = rng.standard_normal((13, C))
    _, _, caches = heads.medusa_forward(params, f, mask, head_w)
    grads = heads.medusa_backward(caches)
    for name, w in params.items():
        num = numerical_grad(lambda: heads.medusa_forward(params, f, mask, head_w)[0], w)
        assert rel_err(num, grads[name]) <= TOL, name
