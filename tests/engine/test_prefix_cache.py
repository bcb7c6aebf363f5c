"""Prefix caching: a cached prefix gives the same logits as a fresh run and computes fewer tokens."""
import numpy as np

from engine.kv.cache import KVCacheManager
from engine.model.llama import forward


def test_prefix_cached_run_equals_fresh_run(tiny):
    model, _ = tiny
    rng = np.random.default_rng(11)
    prefix = rng.integers(0, model.cfg.vocab_size, 70).tolist()
    prompt_a = prefix + rng.integers(0, model.cfg.vocab_size, 9).tolist()
    prompt_b = prefix + rng.integers(0, model.cfg.vocab_size, 13).tolist()

    mgr = KVCacheManager(model.cfg, num_blocks=40, block_size=16)
    a = mgr.new_sequence()
    forward(model, prompt_a, 0, mgr.append_slots(a, prompt_a))
    mgr.commit(a)
    mgr.free(a)                                   # freed, but its full blocks stay cached

    b = mgr.new_sequence()
    cached = mgr.match_prefix(b, prompt_b)
    assert cached == 64                           # 4 full blocks of the shared 70-token prefix
    computed = prompt_b[cached:]
    got = forward(model, computed, cached, mgr.append_slots(b, computed))
    events = [e.kind for e in mgr.pool.drain_events()]
    assert events.count("cache_hit") == 4

    fresh_mgr = KVCacheManager(model.cfg, num_blocks=40, block_size=16, enable_prefix_caching=False)
    f = fresh_mgr.new_sequence()
    assert fresh_mgr.match_prefix(f, prompt_b) == 0
    fresh = forward(model, prompt_b, 0, fresh_mgr.append_slots(f, prompt_b))
    assert len(computed) < len(prompt_b)
    assert np.abs(got - fresh[cached:]).max() <= 1e-5
