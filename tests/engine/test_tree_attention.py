"""Tree attention: one target forward over every node of a draft tree, and the paged cache keeping the path.

- a node's logits equal those of its path decoded as a chain (the shipped character models, SmolLM2 when fetched);
- the cache after a tree's forward and `keep_tree_path` equals the cache after decoding the accepted path as a
  chain, in every cache dtype and block size, and decoding goes on from it as from the chain's;
- a chain through the tree's arguments (mask and positions) is the plain chain, bit for bit.
"""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.cache import BLOCK_SIZES, KVCacheManager
from engine.kv.dtypes import KV_CACHE_DTYPES
from engine.kv.runner import ForwardRequest, PagedRunner, RecomputeRunner
from engine.model.checkpoint import load_checkpoint
from engine.model.config import ModelConfig
from engine.model.fetched import fetched_models
from engine.model.llama import ContextLengthError, Model, forward
from engine.spec_decode.draft import Draft, tree_mask, verification_positions
from engine.spec_decode.tree_verify import verify_tree_greedy

MODELS = Path(__file__).resolve().parents[2] / "models"
# Two children of the root, nodes with none, one and two children, depths 1 to 5: 10 nodes, 11 rows.
PARENTS = [-1, -1, 0, 0, 1, 2, 2, 3, 5, 8]


def path_to(parents, node: int) -> list[int]:  # the nodes from the root's child down to `node`
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_round(runner, context, tokens, parents):  # -> logits [n + 1, V] of the root and the nodes
    """A verification forward as a round makes it: the context's last token (the root), then the nodes."""
    runner.extend(context[:-1])
    draft = Draft(list(tokens), list(parents), np.zeros((len(tokens), 1)))
    root = runner.num_tokens
    return runner.extend([context[-1]] + list(tokens), draft.attention_mask(),
                         positions=verification_positions(parents, root))


def chain_logits(model, mgr, context, tokens, parents):  # -> [n, V]: after each node, its path as a chain
    base = mgr.new_sequence()
    forward(model, context[:-1], 0, mgr.append_slots(base, context[:-1]))
    out = []
    for node in range(len(tokens)):
        seq = mgr.fork(base)
        rows = [context[-1]] + [tokens[i] for i in path_to(parents, node)]
        out.append(forward(model, rows, base.num_tokens, mgr.append_slots(seq, rows))[-1])
        mgr.free(seq)
    mgr.free(base)
    return np.array(out)


def assert_each_node_sees_its_path_only(model, context, tokens, parents, tolerance):
    mgr = KVCacheManager(model.cfg, num_blocks=-(-(len(context) + len(tokens)) // 16) * 3, block_size=16)
    tree = tree_round(PagedRunner(model, mgr), context, tokens, parents)
    expected = chain_logits(model, mgr, context, tokens, parents)
    np.testing.assert_allclose(tree[1:], expected, **tolerance)
    assert (tree[1:].argmax(-1) == expected.argmax(-1)).all()
    mgr.check_invariants()


@pytest.mark.parametrize("name", ["target-mha", "target-gqa"])
@pytest.mark.parametrize("context_len", [30, 300])     # 300: a few query rows against many keys (K q^T in attention)
def test_each_nodes_logits_equal_its_path_decoded_as_a_chain(name, context_len):
    cfg, weights, tok = load_checkpoint(MODELS / name)
    model = Model(cfg, weights)
    text = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 10
    context = tok.encode(text)[:context_len]
    tokens = np.random.default_rng(context_len).integers(0, cfg.vocab_size, len(PARENTS)).tolist()
    tol = 1e-4 * max(1.0, float(np.abs(forward(model, np.array(context), 0)).max()))
    assert_each_node_sees_its_path_only(model, context, tokens, PARENTS, {"rtol": 0, "atol": tol})


def test_each_nodes_logits_equal_its_path_decoded_as_a_chain_on_smollm2():
    lm = next((m for m in fetched_models() if m.name == "smollm2-135m"), None)
    if lm is None:
        pytest.skip("SmolLM2-135M is not in the fetch-model cache (`decoding-playground fetch-model smollm2-135m`)")
    model = lm.model.load()
    context = lm.tokenizer.encode(lm.tokenizer.chat_template.prompt("Name three colours."))
    tokens = lm.tokenizer.encode(" Red, green and blue are three colours of the rainbow.")[:len(PARENTS)]
    assert len(tokens) == len(PARENTS)
    # float32 rounding as in tests/smollm2 (cached == uncached): products over other row counts sum in another order
    assert_each_node_sees_its_path_only(model, context, tokens, PARENTS, {"rtol": 1e-4, "atol": 2e-3})


@pytest.fixture(scope="module")
def small_model():
    cfg = ModelConfig.from_name("tiny").replace(num_attention_heads=4, num_key_value_heads=2)
    from engine.model.checkpoint import init_weights
    return Model(cfg, init_weights(cfg, seed=5, std=0.3))


def stored_rows(mgr, seq, positions):  # -> [(layer K/V as stored [2, nkv, m, hd], per-token scales or None)]
    slots = seq.slots[list(positions)]
    per_token = mgr.dtype.scale == "per_token_head"
    return [(mgr.store.kv[layer][:, :, slots].copy(), mgr.store.scale[layer][:, :, slots].copy() if per_token
             else None) for layer in range(mgr.cfg.num_hidden_layers)]


def resolution(mgr, layer, reference):  # [2, nkv, T, hd] -> how far two roundings into the cache dtype may part
    """Float32 numbers a few bits apart may round to neighbouring values of the cache dtype: one step of it."""
    d = mgr.dtype
    if d.scale == "per_token_head":      # one int8 step of the token-head's absmax, and its float16 scale's rounding
        return np.abs(reference).max(-1, keepdims=True) * (1 / 127 + 2 ** -10)
    if d.name == "auto":
        return 2 ** -23 * np.abs(reference)
    info = ml_dtypes.finfo(d.storage)    # a relative step, and below the normal range an absolute one
    floor = float(info.smallest_subnormal) * (mgr.store.scale[layer] if d.scale == "per_tensor" else 1.0)
    return float(info.eps) * np.abs(reference) + floor


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", list(KV_CACHE_DTYPES))
def test_the_cache_after_a_tree_and_its_path_equals_the_cache_after_the_path_as_a_chain(small_model, dtype,
                                                                                         block_size):
    """For every path a round can accept (each node's, down from the root; none), in a tree whose rows cross a
    block boundary: the kept rows are, bit for bit, what the tree's forward stored for them (K/V and scales moved
    together); the tokens, block count and pool usage are the chain's; the K/V equal the chain's up to the cache
    dtype's rounding of float32 numbers that differ in their last bits; in float32, the next step's logits too."""
    model = small_model
    rng = np.random.default_rng(block_size)
    context = rng.integers(0, model.cfg.vocab_size, 2 * block_size - 3).tolist()
    tokens = rng.integers(0, model.cfg.vocab_size, len(PARENTS)).tolist()
    blocks = -(-(len(context) + len(tokens)) // block_size) + 1
    for last in [None] + list(range(len(PARENTS))):
        path = [] if last is None else path_to(PARENTS, last)
        tree_mgr = KVCacheManager(model.cfg, blocks, block_size, dtype)
        runner = PagedRunner(model, tree_mgr)
        tree_round(runner, context, tokens, PARENTS)
        start = runner.seq.tree_start
        assert start == len(context) - 1
        tree_mgr.check_invariants()
        rows = [0] + [i + 1 for i in path]
        written = stored_rows(tree_mgr, runner.seq, [start + r for r in rows])
        runner.keep_tree_path(rows)
        tree_mgr.check_invariants()
        seq = runner.seq
        kept = stored_rows(tree_mgr, seq, range(start, start + len(rows)))
        for (kv_w, s_w), (kv_k, s_k) in zip(written, kept):
            np.testing.assert_array_equal(kv_k.view(np.uint8), kv_w.view(np.uint8))
            assert s_w is None or (s_w == s_k).all()

        chain_mgr = KVCacheManager(model.cfg, blocks, block_size, dtype)
        chain = chain_mgr.new_sequence()
        forward(model, context[:-1], 0, chain_mgr.append_slots(chain, context[:-1]))
        chain_rows = [context[-1]] + [tokens[i] for i in path]
        forward(model, chain_rows, len(context) - 1, chain_mgr.append_slots(chain, chain_rows))
        assert seq.token_ids == chain.token_ids == context + [tokens[i] for i in path]
        assert len(seq.blocks) == len(chain.blocks) and tree_mgr.pool.num_used_blocks == chain_mgr.pool.num_used_blocks
        held = chain_mgr.append_slots(chain, []).read_slots
        for layer in range(model.cfg.num_hidden_layers):
            got = tree_mgr.store.read(layer, tree_mgr.append_slots(seq, []).read_slots)
            want = chain_mgr.store.read(layer, held)
            assert (np.abs(got - want) <= resolution(chain_mgr, layer, want) + 1e-5 * np.abs(want).max()).all(), layer
        runner.commit()                                  # the path is the sequence now: it may be cached
        tree_mgr.check_invariants()
        if dtype == "auto":
            step = [int(rng.integers(model.cfg.vocab_size))]
            after_tree = runner.extend(step)[-1]
            after_chain = forward(model, step, chain.num_tokens, chain_mgr.append_slots(chain, step))[-1]
            assert np.abs(after_tree - after_chain).max() <= 1e-4 * np.abs(after_chain).max(), path
        runner.free()
        assert tree_mgr.pool.num_used_blocks == 0


def test_a_chain_through_the_tree_arguments_is_todays_chain_bit_for_bit(small_model):
    """Its mask (the causal one, as a tree mask) and positions (consecutive) give the same logits and K/V as the
    plain call; keeping all of its rows is a truncation; a request that carries either is not batched."""
    model = small_model
    rng = np.random.default_rng(11)
    context, drafts = rng.integers(0, model.cfg.vocab_size, 21).tolist(), rng.integers(0, 60, 5).tolist()
    chain = Draft.chain(drafts, np.zeros((5, 1)))
    sees = np.ones((6, 6), bool)
    sees[0, 1:], sees[1:, 1:] = False, tree_mask(chain.parents)
    mask = np.where(sees, 0.0, -np.inf).astype(np.float32)
    results = []
    for as_tree in (False, True):
        mgr = KVCacheManager(model.cfg, 8, 8)
        runner = PagedRunner(model, mgr)
        if as_tree:
            logits = tree_round(runner, context, drafts, chain.parents)
            runner2 = PagedRunner(model, mgr)            # the tree's arguments, given explicitly
            runner2.extend(context[:-1])
            explicit = runner2.extend([context[-1]] + drafts, mask, positions=np.arange(20, 26))
            np.testing.assert_array_equal(explicit, logits)
            runner.keep_tree_path([0, 1, 2, 3])
        else:
            runner.extend(context[:-1])
            logits = runner.extend([context[-1]] + drafts)
            runner.truncate(len(context) + 3)
        kv = np.array([mgr.store.read(layer, mgr.append_slots(runner.seq, []).read_slots)
                       for layer in range(model.cfg.num_hidden_layers)])
        results.append((logits, runner.hidden[:4], kv, runner.token_ids, runner.extend([7])))
    (logits, hidden, kv, ids, after), (tree_logits, tree_hidden, tree_kv, tree_ids, tree_after) = results
    np.testing.assert_array_equal(tree_logits, logits)
    np.testing.assert_array_equal(tree_hidden, hidden)      # the kept rows' hidden states, what heads read
    np.testing.assert_array_equal(tree_kv, kv)
    assert tree_ids == ids
    np.testing.assert_array_equal(tree_after, after)
    assert verification_positions(chain.parents, 20).tolist() == list(range(20, 26))
    runner = PagedRunner(model, KVCacheManager(model.cfg, 8, 8))
    assert ForwardRequest(runner, [1, 2]).causal
    assert not ForwardRequest(runner, [1, 2], positions=[5, 6]).causal


def test_a_recompute_runner_verifies_a_tree_and_keeps_its_path_as_the_paged_one(small_model):
    """Without a cache the whole sequence is recomputed with the tree's rows masked and placed the same way."""
    model = small_model
    rng = np.random.default_rng(3)
    context, tokens = rng.integers(0, 60, 17).tolist(), rng.integers(0, 60, len(PARENTS)).tolist()
    paged, recompute = PagedRunner(model, KVCacheManager(model.cfg, 8, 8)), RecomputeRunner(model)
    a, b = tree_round(paged, context, tokens, PARENTS), tree_round(recompute, context, tokens, PARENTS)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    verification = verify_tree_greedy(tokens, PARENTS, a.argmax(-1))
    for runner in (paged, recompute):
        runner.keep_tree_path(verification.kept_rows)
    assert paged.token_ids == recompute.token_ids == context + [tokens[i] for i in verification.path]
    assert np.abs(paged.hidden - recompute.hidden[len(context) - 1:]).max() <= 1e-5
    assert np.abs(paged.extend([9]) - recompute.extend([9])).max() <= 1e-4 * np.abs(a).max()


def test_a_pending_tree_is_never_cached_appended_to_or_kept_twice(small_model):
    mgr = KVCacheManager(small_model.cfg, 8, 8)
    seq = mgr.new_sequence()
    mgr.append_slots(seq, list(range(10)))
    mgr.append_tree_slots(seq, [1, 2, 3, 4])                # root and three nodes at positions 10..13
    with pytest.raises(RuntimeError, match="keep_tree_path before commit"):
        mgr.commit(seq)
    with pytest.raises(ValueError, match="keep_tree_path before appending"):
        mgr.append_slots(seq, [5])
    for rows in ([0, 4], [2, 1], [0, 0]):
        with pytest.raises(ValueError, match="not a path"):
            mgr.keep_tree_path(seq, rows)
    mgr.keep_tree_path(seq, [0, 3])
    assert seq.token_ids == list(range(10)) + [1, 4] and seq.tree_start is None
    with pytest.raises(ValueError, match="no token tree pending"):
        mgr.keep_tree_path(seq, [0])
    mgr.commit(seq)
    mgr.check_invariants()
    with pytest.raises(ContextLengthError, match="positions"):
        forward(small_model, [1, 2], 0, positions=[0, small_model.cfg.max_position_embeddings])
    with pytest.raises(ValueError, match="positions must be 2 integers"):
        forward(small_model, [1, 2], 0, positions=[0])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_keeping_any_path_of_any_tree_moves_exactly_its_rows(data):
    """Rows written with numbers that name them: after keep_tree_path, position start + i holds row rows[i]'s
    numbers (K, V and int8's scales), whatever the tree, its path, the block size and where the tree starts."""
    cfg = ModelConfig.from_name("tiny").replace(num_hidden_layers=2)
    bs = data.draw(st.sampled_from(BLOCK_SIZES))
    dtype = data.draw(st.sampled_from(["auto", "int8_per_token_head"]))
    n = data.draw(st.integers(1, 20))
    parents = [data.draw(st.integers(-1, i - 1)) for i in range(n)]
    last = data.draw(st.integers(-1, n - 1))
    rows = [0] + [i + 1 for i in (path_to(parents, last) if last >= 0 else [])]
    mgr = KVCacheManager(cfg, 8, bs, dtype)
    seq = mgr.new_sequence()
    context = data.draw(st.integers(1, 40))
    mgr.append_slots(seq, [7] * context)
    mgr.commit(seq)
    kv = mgr.append_tree_slots(seq, list(range(100, 101 + n)))
    named = np.arange(n + 1, dtype=np.float32)[:, None, None, None] + 1    # [n + 1, 1, 1, 1]: row r holds r + 1
    values = np.broadcast_to(named, (n + 1, 2, cfg.num_key_value_heads, cfg.head_dim)).copy()
    for layer in range(cfg.num_hidden_layers):
        kv.write(layer, values * (layer + 1))
    mgr.keep_tree_path(seq, rows)
    mgr.check_invariants()
    assert seq.token_ids == [7] * context + [100 + r for r in rows]
    for layer in range(cfg.num_hidden_layers):
        got = mgr.store.read(layer, mgr.append_slots(seq, []).read_slots)[:, :, context:]   # [2, nkv, m, hd]
        want = (np.array(rows, np.float32) + 1) * (layer + 1)
        np.testing.assert_allclose(got, np.broadcast_to(want[None, None, :, None], got.shape), rtol=1e-2)
