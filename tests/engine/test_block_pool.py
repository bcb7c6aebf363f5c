"""The block pool and the manager, step by step (after vLLM's test_kv_cache_utils), plus a property test."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_pool import BlockPool, KVCacheFullError, hash_block_tokens
from engine.kv.cache import KVCacheManager
from engine.model.config import ModelConfig

CFG = ModelConfig.from_name("tiny")


def kinds(pool):
    return [(e.kind, e.block_id) for e in pool.drain_events()]


def test_allocate_and_free_recycle_blocks():
    pool = BlockPool(4)
    a = pool.get_new_blocks(3)
    assert [b.block_id for b in a] == [0, 1, 2] and all(b.ref_cnt == 1 for b in a)
    assert pool.num_free_blocks == 1
    assert kinds(pool) == [("allocate", 0), ("allocate", 1), ("allocate", 2)]
    pool.free_blocks(a)
    assert pool.num_free_blocks == 4
    assert kinds(pool) == [("free", 2), ("free", 1), ("free", 0)]  # tail first: evicted first
    pool.check_invariants()


def test_exhaustion_raises_a_clear_error():
    pool = BlockPool(2, name="draft")
    pool.get_new_blocks(2)
    with pytest.raises(KVCacheFullError, match=r"'draft' is exhausted: 1 more blocks needed, 0 of 2 free"):
        pool.get_new_blocks(1)


def test_double_free_is_refused():
    pool = BlockPool(2)
    (b,) = pool.get_new_blocks(1)
    pool.free_blocks([b])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free_blocks([b])


def test_cached_block_is_revived_by_hash_and_evicted_on_reuse():
    pool = BlockPool(2)
    (b,) = pool.get_new_blocks(1)
    h = hash_block_tokens(None, [1, 2, 3, 4])
    pool.cache_full_block(b, h)
    pool.free_blocks([b])
    assert pool.get_cached_block(h) is b and b.ref_cnt == 0
    pool.drain_events()
    pool.touch(b)                                  # a prefix-cache hit revives a free block
    assert b.ref_cnt == 1 and pool.num_free_blocks == 1
    assert kinds(pool) == [("cache_hit", b.block_id)]
    pool.touch(b)                                  # a second user shares it
    assert b.ref_cnt == 2 and kinds(pool) == [("share", b.block_id)]
    pool.free_blocks([b, b])
    pool.get_new_blocks(2)                         # both handed out for new content: hash evicted
    assert pool.get_cached_block(h) is None and b.block_hash is None
    pool.check_invariants()


def test_hash_is_chained_over_the_parent():
    h1 = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(h1, [3, 4]) != hash_block_tokens(None, [3, 4])
    assert hash_block_tokens(h1, [3, 4]) == hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])


def test_manager_appends_truncates_and_frees():
    mgr = KVCacheManager(CFG, num_blocks=6, block_size=8)
    seq = mgr.new_sequence()
    mgr.append_slots(seq, list(range(20)))
    assert seq.block_table == [0, 1, 2] and seq.num_tokens == 20
    mgr.truncate(seq, 9)                           # rolling back rejected tokens frees the empty block
    assert seq.block_table == [0, 1] and seq.num_tokens == 9
    assert mgr.pool.num_used_blocks == 2
    mgr.truncate(seq, 8)
    assert seq.block_table == [0]
    mgr.free(seq)
    assert mgr.pool.num_used_blocks == 0
    mgr.pool.check_invariants()


def test_prefix_blocks_are_shared_and_never_overwritten():
    mgr = KVCacheManager(CFG, num_blocks=8, block_size=8)
    a = mgr.new_sequence()
    prompt = list(range(20))
    mgr.append_slots(a, prompt)
    mgr.commit(a)                                  # blocks 0 and 1 are full: cached
    b = mgr.new_sequence()
    assert mgr.match_prefix(b, prompt) == 16
    assert b.block_table == [0, 1] and mgr.pool.blocks[0].ref_cnt == 2
    mgr.append_slots(b, prompt[16:])
    assert b.block_table[2] != a.block_table[2]    # the partial block is private
    mgr.truncate(b, 12)                            # into a shared block: b gets a private copy
    assert b.block_table[1] != 1 and mgr.pool.blocks[1].ref_cnt == 1
    mgr.free(a)
    mgr.free(b)
    assert mgr.pool.num_used_blocks == 0
    mgr.pool.check_invariants()


def test_a_rerun_of_a_prompt_keeps_its_table_one_run_of_blocks():
    """The prompt's blocks are cache hits and the blocks after them hold the last run's continuation: the
    rerun takes those (evicting what they held) rather than blocks elsewhere, so K/V stay one slice."""
    mgr = KVCacheManager(CFG, num_blocks=12, block_size=8)
    prompt, output = list(range(20)), list(range(50, 70))
    first = mgr.new_sequence()
    mgr.append_slots(first, prompt)
    for t in output:                               # decode: a commit after every token, as a session does
        mgr.append_slots(first, [t])
        mgr.commit(first)
    assert first.block_table == [0, 1, 2, 3, 4] and first.contiguous
    mgr.free(first)                                # all five keep their hashes (4 full blocks cached)
    rerun = mgr.new_sequence()
    assert mgr.match_prefix(rerun, prompt) == 16   # blocks 0 and 1
    mgr.append_slots(rerun, prompt[16:])
    for t in [99] * 20:                            # a different continuation: the old one is evicted
        mgr.append_slots(rerun, [t])
        mgr.commit(rerun)
    assert rerun.block_table == [0, 1, 2, 3, 4] and rerun.contiguous
    mgr.pool.check_invariants()


def test_a_cached_block_of_another_chain_is_not_taken_out_of_order():
    """Block 2 holds the start of another prompt (cached, free): a sequence ending at block 1 does not take
    it (it did not follow block 1 before), so the LRU order keeps that prefix."""
    mgr = KVCacheManager(CFG, num_blocks=6, block_size=8)
    a = mgr.new_sequence()
    mgr.append_slots(a, list(range(16)))           # blocks 0, 1
    other = mgr.new_sequence()
    mgr.append_slots(other, list(range(100, 108)))  # block 2: the first block of its own table
    mgr.commit(other)
    mgr.free(other)
    mgr.append_slots(a, [7])                       # needs a third block
    assert a.block_table[2] != 2 and mgr.pool.blocks[2].block_hash is not None
    mgr.pool.check_invariants()


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    mgr = KVCacheManager(CFG, num_blocks=8, block_size=8)
    a = mgr.new_sequence()
    mgr.append_slots(a, list(range(16)))
    mgr.commit(a)
    b = mgr.new_sequence()
    assert mgr.match_prefix(b, list(range(16))) == 8


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    mgr = KVCacheManager(CFG, num_blocks=8, block_size=8)
    a = mgr.new_sequence()
    mgr.append_slots(a, list(range(12)))
    c = mgr.fork(a)
    assert c.block_table[0] == a.block_table[0] and c.block_table[1] != a.block_table[1]
    assert mgr.pool.blocks[a.block_table[0]].ref_cnt == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["new", "append", "truncate", "fork", "free", "commit"]),
                          st.integers(0, 10_000), st.integers(1, 20)), max_size=60))
def test_no_block_leaks_under_any_sequence_of_operations(ops):
    """Any mix of allocate / append / truncate / fork / free leaves every block counted exactly once."""
    mgr = KVCacheManager(CFG, num_blocks=24, block_size=8)
    live = []
    for op, pick, n in ops:
        seq = live[pick % len(live)] if live else None
        try:
            if op == "new" or seq is None:
                s = mgr.new_sequence()
                mgr.match_prefix(s, [t % 5 for t in range(n + 8)])
                live.append(s)
            elif op == "append":
                mgr.append_slots(seq, [(pick + i) % 5 for i in range(n)])
            elif op == "truncate":
                mgr.truncate(seq, pick % (seq.num_tokens + 1))
            elif op == "fork":
                live.append(mgr.fork(seq))
            elif op == "commit":
                mgr.commit(seq)
            else:
                mgr.free(seq)
                live.remove(seq)
        except KVCacheFullError:
            pass
        except ValueError as e:                    # context limit: a clear error, nothing leaked
            assert "context" in str(e)
        mgr.pool.check_invariants()
        refs = np.zeros(mgr.pool.num_blocks, int)
        for s in live:
            assert len(s.blocks) == -(-s.num_tokens // 8)
            for b in s.blocks:
                refs[b.block_id] += 1
        assert [b.ref_cnt for b in mgr.pool.blocks] == refs.tolist()
    for s in live:
        mgr.free(s)
    assert mgr.pool.num_used_blocks == 0


def test_block_states_follow_every_change():
    """block_states() is kept block by block (not rebuilt); check_invariants compares it with the blocks."""
    pool = BlockPool(4)
    assert pool.block_states() == "ffff"
    a, b = pool.get_new_blocks(2)
    pool.touch(b)                                   # a second reference: shared
    assert pool.block_states() == "usff"
    pool.cache_full_block(a, hash_block_tokens(None, [1, 2]))
    pool.free_blocks([a, b])                        # a keeps its hash (cached), b is still used once
    assert pool.block_states() == "cuff"
    pool.touch(a)                                   # a prefix-cache hit revives it
    assert pool.block_states() == "uuff"
    pool.free_blocks([a])
    pool.uncache_block(a)
    assert pool.block_states() == "fuff"
    pool.get_new_blocks(3)                          # reuse: free blocks handed out again
    assert pool.block_states() == "uuuu"
    pool.check_invariants()
