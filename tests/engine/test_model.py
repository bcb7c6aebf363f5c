"""Model invariants: cached == uncached, lean == straightforward reference, paged == dense."""
import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.model import reference
from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import ContextLengthError, Model, causal_mask, forward, forward_no_cache


def greedy_cached(model, mgr, prompt, steps):
    seq = mgr.new_sequence()
    logits = forward(model, prompt, 0, mgr.append_slots(seq, prompt))[-1:]
    tokens, all_logits = [], []
    for _ in range(steps):
        all_logits.append(logits[-1])
        t = int(np.argmax(logits[-1]))
        tokens.append(t)
        p0 = seq.num_tokens
        logits = forward(model, [t], p0, mgr.append_slots(seq, [t]))
    return tokens, np.array(all_logits), seq


def greedy_uncached(model, prompt, steps):
    seq, tokens, all_logits = list(prompt), [], []
    for _ in range(steps):
        logits = forward_no_cache(model, seq)[-1]
        all_logits.append(logits)
        t = int(np.argmax(logits))
        tokens.append(t)
        seq.append(t)
    return tokens, np.array(all_logits)


def test_cached_equals_uncached_200_tokens(seed_target):
    model, _ = seed_target
    prompt = np.random.default_rng(0).integers(0, model.cfg.vocab_size, 20)
    mgr = KVCacheManager(model.cfg, num_blocks=32, block_size=16)
    cached, cached_logits, _ = greedy_cached(model, mgr, prompt, 200)
    uncached, uncached_logits = greedy_uncached(model, prompt, 200)
    assert cached == uncached
    assert np.abs(cached_logits - uncached_logits).max() <= 1e-4


@pytest.mark.parametrize("preset,kv_heads,first,then", [
    ("tiny", 4, 25, 15), ("tiny", 2, 25, 15), ("tiny", 1, 25, 15), ("seed-target", 4, 25, 15),
    # a few new tokens after a long context: attention takes its K q^T path (engine.model.attention)
    ("tiny", 4, 300, 5), ("tiny", 2, 300, 5), ("tiny", 1, 300, 5)])
def test_lean_forward_matches_straightforward_reference(make_model, preset, kv_heads, first, then):
    model, weights = make_model(preset, num_key_value_heads=kv_heads, max_position_embeddings=512)
    tokens = np.random.default_rng(3).integers(0, model.cfg.vocab_size, first + then)
    ref_cache = reference.DenseKVCache(model.cfg)
    expected = np.concatenate([reference.forward(model.cfg, weights, tokens[:first], ref_cache),
                               reference.forward(model.cfg, weights, tokens[first:], ref_cache)])
    mgr = KVCacheManager(model.cfg, num_blocks=-(-(first + then) // 8), block_size=8)
    seq = mgr.new_sequence()
    got = np.concatenate([forward(model, tokens[:first], 0, mgr.append_slots(seq, tokens[:first])),
                          forward(model, tokens[first:], first, mgr.append_slots(seq, tokens[first:]))])
    assert np.abs(got - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max())


def test_paged_equals_dense_for_random_block_layouts(tiny):
    """Three sequences grow in a random interleaving, so their block tables are scattered in the pool."""
    model, _ = tiny
    rng = np.random.default_rng(7)
    for trial in range(5):
        mgr = KVCacheManager(model.cfg, num_blocks=40, block_size=8)
        seqs = [mgr.new_sequence() for _ in range(3)]
        tokens = [rng.integers(0, model.cfg.vocab_size, 90) for _ in range(3)]
        outs = [[] for _ in range(3)]
        while any(s.num_tokens < 90 for s in seqs):
            i = int(rng.integers(3))
            s = seqs[i]
            if s.num_tokens == 90:
                continue
            n = int(min(rng.integers(1, 12), 90 - s.num_tokens))
            chunk = tokens[i][s.num_tokens:s.num_tokens + n]
            p0 = s.num_tokens
            outs[i].append(forward(model, chunk, p0, mgr.append_slots(s, chunk)))
        assert not all(s.contiguous for s in seqs), "the layout should be scattered"
        for i in range(3):
            dense = forward_no_cache(model, tokens[i])
            assert np.abs(np.concatenate(outs[i]) - dense).max() <= 1e-4


def test_block_sizes_give_the_same_logits(tiny):
    model, _ = tiny
    prompt = np.random.default_rng(5).integers(0, model.cfg.vocab_size, 30)
    results = []
    for bs in (8, 16, 32):
        mgr = KVCacheManager(model.cfg, num_blocks=16, block_size=bs)
        _, logits, _ = greedy_cached(model, mgr, prompt, 60)
        results.append(logits)
    assert np.abs(results[0] - results[1]).max() <= 1e-5
    assert np.abs(results[0] - results[2]).max() <= 1e-5


def test_position_beyond_context_is_a_clear_error(tiny):
    model, _ = tiny
    n = model.cfg.max_position_embeddings
    with pytest.raises(ContextLengthError, match="max_position_embeddings"):
        forward_no_cache(model, np.zeros(n + 1, int))
    mgr = KVCacheManager(model.cfg, num_blocks=64, block_size=16)
    seq = mgr.new_sequence()
    forward(model, np.zeros(n, int), 0, mgr.append_slots(seq, np.zeros(n, int)))
    with pytest.raises(ValueError, match="context"):
        mgr.append_slots(seq, [1])


@pytest.mark.parametrize("dtype", ["auto", "int8_per_token_head"])
def test_batched_forward_equals_one_by_one(seed_target, dtype):
    """Continuous batching: mixed lengths (decode steps and a verify block) in one computation."""
    from engine.model.llama import forward_batch
    model, _ = seed_target
    rng = np.random.default_rng(9)
    mgr_a = KVCacheManager(model.cfg, num_blocks=60, block_size=16, kv_cache_dtype=dtype)
    mgr_b = KVCacheManager(model.cfg, num_blocks=60, block_size=16, kv_cache_dtype=dtype)
    prompts = [rng.integers(0, model.cfg.vocab_size, n) for n in (5, 40, 17, 90)]
    new = [rng.integers(0, model.cfg.vocab_size, n) for n in (1, 1, 5, 3)]
    expected, requests = [], []
    for p, t in zip(prompts, new):
        for mgr in (mgr_a, mgr_b):
            s = mgr.new_sequence()
            forward(model, p, 0, mgr.append_slots(s, p))
            if mgr is mgr_a:
                expected.append(forward(model, t, len(p), mgr.append_slots(s, t)))
            else:
                requests.append((t, len(p), mgr.append_slots(s, t)))
    got = forward_batch(model, requests)
    for e, g in zip(expected, got):     # float32 rounding differs with the number of rows in a product
        assert np.abs(e - g).max() <= 5e-5
    # sequences from different stores (models' dtypes) fall back to per-sequence writes
    mixed = forward_batch(model, [requests[0], (new[0], len(prompts[0]), requests[1][2])])
    assert mixed[0].shape == (1, model.cfg.vocab_size)


class ReadAndWriteOnly:
    """A sequence's cache seen through `write` and `read` only: a one-token step cannot use the store's arrays."""

    def __init__(self, kv):
        self.kv = kv

    def write(self, layer, kv):
        self.kv.write(layer, kv)

    def read(self, layer):
        return self.kv.read(layer)

    def direct(self):
        return None


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("dtype", ["auto", "int8_per_token_head"])
def test_a_decode_step_in_the_stores_arrays_equals_one_through_write_and_read(kv_heads, dtype):
    """A one-token step writes and reads K/V in the store's own arrays where the cache allows it
    (`SequenceKV.direct`: a float32 cache, the sequence in one run of blocks); its logits and K/V equal those of
    the same step through the cache's write and read, for MHA / GQA / MQA, contiguous and scattered."""
    cfg = ModelConfig.from_name("tiny").replace(num_attention_heads=4, num_key_value_heads=kv_heads)
    model = Model(cfg, init_weights(cfg, seed=3, std=0.3))
    tokens = np.random.default_rng(4).integers(0, cfg.vocab_size, 40)
    for scattered in (False, True):
        runs = []
        for in_place in (True, False):
            mgr = KVCacheManager(cfg, num_blocks=12, block_size=8, kv_cache_dtype=dtype)
            other = mgr.new_sequence()
            seq = mgr.new_sequence()
            forward(model, tokens[:20], 0, mgr.append_slots(seq, tokens[:20]))
            if scattered:                        # another sequence takes the next block first
                mgr.append_slots(other, tokens[:8])
            steps, direct = [], []
            for i in range(20, 40):
                kv = mgr.append_slots(seq, tokens[i:i + 1])
                direct.append(kv.direct() is not None)
                steps.append(forward(model, tokens[i:i + 1], i, kv if in_place else ReadAndWriteOnly(kv)))
            assert seq.contiguous != scattered
            assert any(direct) == (dtype == "auto")            # a float32 cache: in place while the blocks run on
            assert all(direct) == (dtype == "auto" and not scattered)
            runs.append((np.concatenate(steps), mgr.store.read(1, mgr.append_slots(seq, []).read_slots)))
        for a, b in zip(*runs):
            np.testing.assert_array_equal(a, b)


def test_products_in_4_row_pieces_give_the_plain_products_logits(seed_target):
    """`Model.split_rows` (measured where a model is loaded) only changes how a few rows' products are cut."""
    model, _ = seed_target
    tokens = np.random.default_rng(6).integers(0, model.cfg.vocab_size, 30)
    runs = []
    for split in (frozenset(), frozenset(range(2, 17))):
        model.split_rows = split
        mgr = KVCacheManager(model.cfg, num_blocks=4, block_size=16)
        seq = mgr.new_sequence()
        forward(model, tokens[:20], 0, mgr.append_slots(seq, tokens[:20]))
        runs.append([forward(model, tokens[a:b], a, mgr.append_slots(seq, tokens[a:b]))
                     for a, b in ((20, 23), (23, 28), (28, 30))])
    del model.split_rows
    for a, b in zip(*runs):             # float32 rounding: products summed in another order
        assert np.abs(a - b).max() <= 5e-5


def test_the_mask_is_data_the_causal_one_by_default(seed_target):
    """`forward(mask=...)`: the causal mask given explicitly changes nothing; a full mask lets each new position
    see the ones after it (the teaching fault): in the first layer every position but the last sees more, and
    through the K/V of the next layers the last one too."""
    model, _ = seed_target
    tokens = np.random.default_rng(8).integers(0, model.cfg.vocab_size, 25)

    def verify(mask):
        mgr = KVCacheManager(model.cfg, num_blocks=4, block_size=16)
        seq = mgr.new_sequence()
        forward(model, tokens[:20], 0, mgr.append_slots(seq, tokens[:20]))
        return forward(model, tokens[20:], 20, mgr.append_slots(seq, tokens[20:]), mask=mask)
    plain = verify(None)
    np.testing.assert_array_equal(verify(causal_mask(5)), plain)
    full = verify(np.zeros((5, 5), np.float32))
    assert all(np.abs(full[i] - plain[i]).max() > 1e-3 for i in range(5))
