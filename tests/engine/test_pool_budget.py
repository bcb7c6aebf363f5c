"""KV pools within the server's memory budget (engine/serving/pools.py): a client cycling `kv_cache_dtype` and
`block_size` cannot make the process hold a pool per combination; idle pools are freed (least recently used
first) and made again when used; a pool that cannot fit is refused with an error naming the setting, and the
generation that asked runs on; a pool in use is never freed.

Bytes are counted on the pools themselves (their K/V arrays, and what numpy holds: tracemalloc), never by timing.
"""
from __future__ import annotations

import itertools
import sys
import tracemalloc

import pytest

from engine.kv.cache import BLOCK_SIZES
from engine.kv.dtypes import KV_CACHE_DTYPES
from engine.serving.pools import PoolBudgetError
from engine.serving.registry import InferenceEngine
from engine.serving.session import GenerationSession
from engine.serving.settings import GenerationSettings, SettingsError

PROMPT = "def add(a, b):\n    return a + b\n"
DTYPES = list(KV_CACHE_DTYPES)
# What a process holds beside the pools' K/V arrays while a session cycles (the pools' Python objects, a Block per
# block; the session's tables, logits and events): under 5% of the budget of `wide` below, at 32 sessions a pool.
SLACK = 0.05


@pytest.fixture(scope="module")
def wide():
    """A target whose K/V per token (2 KiB in float32) make its pools' arrays most of what they hold, and a draft."""
    from engine.model.checkpoint import init_weights
    from engine.model.config import ModelConfig
    from engine.model.llama import Model
    from engine.model.tokenizer import TextTokenizer
    from engine.serving.registry import LoadedModel, ModelRegistry

    tok = TextTokenizer.char_level("abcdefghijklmnopqrstuvwxyz ():\n.=_,+")
    base = ModelConfig.from_name("tiny").replace(vocab_size=tok.vocab_size, eos_token_id=None)

    def lm(name, role, seed, **kw):
        cfg = base.replace(**kw)
        return LoadedModel(name, role, cfg, Model(cfg, init_weights(cfg, seed=seed, std=0.3)), tok)

    return ModelRegistry([lm("w", "target", 1, hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                             head_dim=32),
                          lm("wd", "draft", 2, hidden_size=32, num_hidden_layers=1)])


def pool_bytes(engine) -> int:
    """What the pools' K/V arrays hold now (their own arrays, not the accounting)."""
    return sum(m.store.nbytes() for m in list(engine.managers.values()))


def spec_bytes(engine, name, dtype="auto", block_size=16) -> int:
    return engine.pool_spec(engine.registry.models[name], dtype, block_size).nbytes


def session_pools(engine, settings: dict) -> int:
    target = engine.registry.get(settings.get("model"))
    return sum(s.nbytes for s in engine.pool_specs(target, GenerationSettings.parse(settings)).values())


def run(engine, settings: dict, prompt=PROMPT):
    events = list(GenerationSession(engine, prompt, settings).events())
    assert events[-1].type == "done", events[-1]
    return events[-1].summary


def drive(session, rounds: int):
    """The first `rounds` rounds of a session (its generator, paused after them)."""
    gen = session.events()
    for e in gen:
        if e.type == "round" and e.round >= rounds:
            return gen
    raise AssertionError("the session ended early")


def test_the_default_budget_is_twice_the_pools_made_at_start_up(family):
    engine = InferenceEngine(family().registry)
    for target in engine.registry.targets:
        engine.warm_up(target)
    assert engine.default_pool_bytes == pool_bytes(engine) == engine.pools.held_bytes() > 0
    assert engine.kv_cache_memory == 2 * engine.default_pool_bytes
    for m in engine.managers.values():                  # the accounting is the arrays' size
        assert m.nbytes == m.store.nbytes()


def test_cycling_every_dtype_and_block_size_stays_within_the_budget(wide):
    tracemalloc.start()
    try:
        engine = InferenceEngine(wide, max_sessions=32)
        for target in wide.targets:
            engine.warm_up(target)
        budget = engine.kv_cache_memory
        every = sum(spec_bytes(engine, name, d, b) for name in ("w", "wd") for d in DTYPES for b in BLOCK_SIZES)
        assert every > 2 * budget                   # without the budget the cycle below would hold all of these
        s = GenerationSession(engine, PROMPT, {"model": "w", "method": "draft_model", "max_tokens": 60})
        cycle = iter(itertools.product(BLOCK_SIZES, DTYPES))
        seen, applied = set(), 0
        for e in s.events():
            assert pool_bytes(engine) <= budget and engine.pools.held_bytes() <= budget
            seen |= {id(m) for m in engine.managers.values()}
            if e.type == "settings_applied":
                applied += 1
            if e.type == "round":
                change = next(cycle, None)
                if change is not None:
                    s.update_settings({"block_size": change[0], "kv_cache_dtype": change[1]})
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.type == "done" and applied >= len(DTYPES) * len(BLOCK_SIZES) - 2, (e, applied)
    assert engine.pools.freed >= 10 and engine.pools.refused == 0 and len(seen) > len(engine.managers)
    assert peak <= budget * (1 + SLACK), (peak, budget)       # every pool's arrays, and the moments between
    assert held <= budget * (1 + SLACK), (held, budget)


def test_a_pool_over_the_budget_is_refused_and_the_generation_runs_on_unchanged(family):
    registry = family().registry
    settings = {"model": "t-mha", "method": "draft_model", "max_tokens": 40}
    reference = run(InferenceEngine(registry), settings)
    engine = InferenceEngine(registry)
    in_use = session_pools(engine, settings)
    engine.pools.budget = in_use + session_pools(engine, {**settings, "kv_cache_dtype": "fp8_e4m3"})
    s = GenerationSession(engine, PROMPT, settings)
    gen = drive(s, 3)
    made = dict(engine.managers)
    with pytest.raises(SettingsError) as refused:
        s.update_settings({"kv_cache_dtype": "float16"})        # twice fp8's bytes: no room beside the pools in use
    assert refused.value.setting == "kv_cache_dtype"
    assert "KV cache memory" in str(refused.value) and "--kv-cache-memory" in str(refused.value)
    assert engine.managers == made and engine.pools.refused == 1
    with pytest.raises(SettingsError) as start:                 # a start that would need it too
        GenerationSession(engine, PROMPT, {**settings, "block_size": 8})
    assert start.value.setting == "block_size"
    s.update_settings({"kv_cache_dtype": "fp8_e4m3"})          # what fits is still taken
    s.update_settings({"kv_cache_dtype": "auto"})              # (and taken back before the boundary)
    events = list(gen)
    assert events[-1].type == "done"
    assert events[-1].summary["tokens"] == reference["tokens"]
    assert engine.managers == made and pool_bytes(engine) <= engine.pools.budget


def test_a_pool_bigger_than_the_whole_budget_is_refused_at_the_start(family):
    registry = family().registry
    engine = InferenceEngine(registry, kv_cache_memory=spec_bytes(InferenceEngine(registry), "t-mha") - 1)
    with pytest.raises(SettingsError) as refused:
        GenerationSession(engine, PROMPT, {"model": "t-mha", "method": "none"})
    assert refused.value.setting == "model" and "does not fit" in str(refused.value)
    with pytest.raises(SettingsError) as refused:             # 32-token blocks: a few more slots than 16's
        GenerationSession(engine, PROMPT, {"model": "t-mha", "method": "none", "block_size": 32})
    assert refused.value.setting == "block_size"
    assert not engine.managers
    run(engine, {"model": "t-mha", "method": "none", "kv_cache_dtype": "fp8_e5m2", "max_tokens": 5})  # a quarter fits


def test_an_idle_pool_is_freed_least_recently_used_first_and_made_again_with_the_same_output(family):
    engine = InferenceEngine(family().registry)
    for target in engine.registry.targets:
        engine.warm_up(target)
    warm = dict(engine.managers)
    a = {"model": "t-mha", "method": "none", "kv_cache_dtype": "float16", "block_size": 8, "max_tokens": 30}
    b = {**a, "kv_cache_dtype": "bfloat16", "block_size": 32}
    c = {**a, "kv_cache_dtype": "float16", "block_size": 32}          # as big as b
    engine.pools.budget = engine.default_pool_bytes + session_pools(engine, a) + session_pools(engine, b)
    first = run(engine, a)
    pool_a = engine.managers[("t-mha", "float16", 8)]
    run(engine, b)                                    # both fit: nothing is freed
    assert engine.pools.freed == 0 and set(warm) < set(engine.managers)
    run(engine, a)                                    # a is used again: b is the least recently used now
    run(engine, c)                                    # c needs room: b goes (not a, not a pool made at start-up)
    assert ("t-mha", "bfloat16", 32) not in engine.managers and ("t-mha", "float16", 8) in engine.managers
    assert engine.pools.freed == 1
    assert all(engine.managers.get(k) is m for k, m in warm.items())
    run(engine, b)                                    # and now a goes, least recently used, before any warm pool
    assert ("t-mha", "float16", 8) not in engine.managers and pool_a.released
    assert all(engine.managers.get(k) is m for k, m in warm.items())
    again = run(engine, a)                            # made again, a new pool: the same output
    assert engine.managers[("t-mha", "float16", 8)] is not pool_a
    assert again["tokens"] == first["tokens"] and again["text"] == first["text"]
    assert engine.pools.freed >= 3 and pool_bytes(engine) <= engine.pools.budget


def test_a_pool_in_use_is_never_freed(family):
    registry = family().registry
    engine = InferenceEngine(registry)
    a = {"model": "t-mha", "method": "none", "kv_cache_dtype": "float16", "block_size": 8, "max_tokens": 40}
    b = {**a, "kv_cache_dtype": "bfloat16", "block_size": 32}
    reference = run(InferenceEngine(registry), a)
    engine.pools.budget = session_pools(engine, a) + session_pools(engine, b) - 1     # only one of them at a time
    s = GenerationSession(engine, PROMPT, a)
    pool = engine.managers[("t-mha", "float16", 8)]
    queued = GenerationSession(engine, PROMPT, {**a, "max_tokens": 5})   # made, not run yet: holds the same pool
    gen = drive(s, 2)
    with pytest.raises(SettingsError):                # a running generation's pool
        GenerationSession(engine, PROMPT, b)
    events = list(gen)
    assert events[-1].summary["tokens"] == reference["tokens"] and not pool.released
    with pytest.raises(SettingsError):                # a generation made but not started holds its pools too
        GenerationSession(engine, PROMPT, b)
    queued.close()
    run(engine, b)                                    # now idle: freed for b
    assert pool.released and ("t-mha", "float16", 8) not in engine.managers
    # a sequence in a pool nobody claimed (a caller of engine.manager) keeps it too
    held = engine.manager(registry.models["t-mha"], "float16", 8)
    seq = held.new_sequence()
    with pytest.raises(PoolBudgetError):
        engine.manager(registry.models["t-mha"], "bfloat16", 32)
    assert not held.released
    held.free(seq)


def test_a_session_dropped_without_closing_gives_its_pools_back(family):
    import gc

    engine = InferenceEngine(family().registry)
    a = {"model": "t-mha", "method": "none", "kv_cache_dtype": "float16", "block_size": 8}
    b = {**a, "kv_cache_dtype": "bfloat16", "block_size": 32}
    engine.pools.budget = session_pools(engine, a) + session_pools(engine, b) - 1
    s = GenerationSession(engine, PROMPT, a)
    with pytest.raises(SettingsError):
        GenerationSession(engine, PROMPT, b)
    del s
    gc.collect()
    run(engine, {**b, "max_tokens": 5})


def test_the_eagle_pool_is_known_before_its_head_loads(family):
    from test_heads import random_heads

    engine = family()
    lm = engine.registry.get("t-mha")
    engine.registry.set_heads("t-mha", random_heads(lm))
    settings = GenerationSettings.parse({"model": "t-mha", "method": "eagle"})
    specs = engine.pool_specs(lm, settings)
    run(engine, {"model": "t-mha", "method": "eagle", "max_tokens": 10})
    assert set(specs) == {("t-mha", "auto", 16), ("t-mha-eagle", "auto", 16)} and set(specs) <= set(engine.managers)
    for key, spec in specs.items():
        assert engine.managers[key].nbytes == engine.managers[key].store.nbytes() == spec.nbytes


def test_a_pool_whose_make_fails_leaves_nothing_reserved_and_a_claimed_one_is_kept():
    from engine.kv.cache import KVCacheManager
    from engine.model.config import ModelConfig
    from engine.serving.pools import KVPools

    cfg = ModelConfig.from_name("tiny")
    a, b, c, d = (("t", dtype, 16) for dtype in ("auto", "float16", "bfloat16", "fp8_e4m3"))

    def pool(blocks):
        return KVCacheManager(cfg, blocks, 16)

    one = pool(1).nbytes
    pools = KVPools(budget=10 * one)

    def broken():
        raise MemoryError("no room")

    with pytest.raises(MemoryError):
        pools.get(a, 8 * one, broken)
    assert pools.get(b, 9 * one, lambda: pool(9)).nbytes == 9 * one      # the 8 were not kept for a
    with pytest.raises(PoolBudgetError, match="more than all of it"):
        pools.get(c, 11 * one, lambda: pool(11))
    claim = pools.claim()
    with pytest.raises(PoolBudgetError, match="held by pools in use"):
        claim.set({b: 9 * one, d: 2 * one})                                # b kept by the claim: no room for d
    assert pools.get(d, 2 * one, lambda: pool(2)).nbytes == 2 * one       # the claim was refused: b idle, freed
    assert b not in pools.made and pools.freed == 1 and pools.held_bytes() == 2 * one


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory read from /proc/self/status")
def test_a_freed_pool_gives_its_memory_back_to_the_system():
    """The process's resident memory follows the pools held while pools of other dtypes are made (each in a thread
    of its own, as a server's starts are) and freed. Without handing freed memory back (glibc keeps a freed pool's
    arrays for later allocations once they are under its mmap threshold) it stayed up to half a pool above them."""
    import threading

    from engine.kv.cache import KVCacheManager
    from engine.model.config import ModelConfig
    from engine.serving.pools import KVPools

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    cfg = ModelConfig.from_name("tiny").replace(hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                                                head_dim=64, num_hidden_layers=8)    # 12.5 MiB a layer in float32
    blocks = 400
    pool_bytes = KVCacheManager(cfg, blocks, 16).nbytes
    pools = KVPools(budget=int(1.6 * pool_bytes))
    base = rss()
    for dtype in ("auto", "float16", "bfloat16", "auto", "float16", "fp8_e4m3", "auto", "bfloat16"):
        spec = KVCacheManager(cfg, 1, 16, dtype).nbytes * blocks
        maker = threading.Thread(target=pools.get, args=(("t", dtype, 16), spec,
                                                          lambda d=dtype: KVCacheManager(cfg, blocks, 16, d)))
        maker.start()
        maker.join()
        # the suite's other threads (servers of earlier tests) also allocate: 16 MiB for them, far below one pool
        assert rss() - base <= pools.held_bytes() + 0.05 * pool_bytes + 16 * 2**20, (dtype, rss() - base,
                                                                                      pools.held_bytes())
    assert pools.freed >= 4
