"""The paged KV cache's block tables, over the K/V numbers of engine/kv/store.py's `KVStore`.

    slot = block_table[pos // block_size] * block_size + pos % block_size      (PagedAttention)

`KVCacheManager` speaks in sequences (after vLLM's KVCacheManager): it appends slots for new tokens,
reuses cached prefix blocks, rolls back rejected tokens, forks and frees, and reports every block
event through the pool. `SequenceKV` is what `engine.model.llama.forward` writes to and reads from.

A token tree is verified in one forward whose rows take the slots after the committed context in node order
(`append_tree_slots`: scratch, never cached). Verification picks one path down the tree; `keep_tree_path`
moves that path's K/V (and scales) to the first of those slots, in order, and frees the rest, so that the cache
then holds exactly what decoding the path as a chain would have written.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..model.config import ModelConfig
from .block_pool import Block, BlockPool, hash_block_tokens
from .dtypes import KVCacheDType, kv_bytes_per_token, resolve_kv_cache_dtype
from .store import KVStore, trim_freed_memory

BLOCK_SIZES = (8, 16, 32)


@dataclass
class Sequence:
    """One sequence's block table and the tokens whose K/V it holds.

    NOTE: only the last block is ever written to, and it is never shared: shared blocks (prefix
    cache, fork) are full. `slots[pos]` caches the slot formula for every position held.
    """
    seq_id: int
    max_tokens: int
    blocks: list[Block] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)    # of the first len() full blocks
    slots: np.ndarray = None    # [max blocks x block_size] slot of each position
    contiguous: bool = True     # blocks have consecutive ids: the whole table is one slice
    tree_start: int | None = None   # a token tree's forward holds positions tree_start.. in node order, until
    #                                 `keep_tree_path` keeps one path of it (None: no tree pending)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def block_table(self) -> list[int]:
        return [b.block_id for b in self.blocks]


class SequenceKV:
    """The view `forward` uses for one call: where to write this call's K/V, where to read them all."""
    __slots__ = ("store", "write_slots", "read_slots")

    def __init__(self, store: KVStore, write_slots, read_slots):
        self.store, self.write_slots, self.read_slots = store, write_slots, read_slots

    def write(self, layer, kv):
        self.store.write(layer, self.write_slots, kv)

    def read(self, layer):
        return self.store.read(layer, self.read_slots)

    def direct(self):  # -> (per-layer arrays, the slot written, the slots held as a slice) or None
        """For a one-token step (engine/model/llama.py) when K/V can be used in place: a float32 store and the
        sequence in one run of blocks. Otherwise None: write() and read() convert and gather."""
        if self.store.dtype.name != "auto" or not isinstance(self.read_slots, slice):
            return None
        return self.store.kv, self.write_slots.start, self.read_slots


@dataclass(frozen=True)
class PoolSnapshot:
    """A KV pool as it stands now (what the page, /api/stats and the teaching views show of it)."""
    name: str
    kv_cache_dtype: str
    block_size: int
    num_blocks: int
    used: int                   # blocks held by sequences
    cached: int                 # free blocks that still hold a prefix-cache entry
    bytes_per_token: int
    block_states: str           # one letter a block: f(ree) c(ached) u(sed) s(hared)
    nbytes: int = 0             # K/V memory the pool holds (every block's, used or not)

    @property
    def key(self) -> tuple:
        """(pool name, kv_cache_dtype, block_size): one KV cache manager."""
        return (self.name, self.kv_cache_dtype, self.block_size)

    def drawn(self, role: str | None = None, block_table=()) -> dict:
        """The pool as a `kv` event carries it (docs/protocol.md), for one sequence's blocks (or none)."""
        d = {"name": self.name, "num_blocks": self.num_blocks, "block_size": self.block_size,
             "kv_cache_dtype": self.kv_cache_dtype, "bytes_per_token": self.bytes_per_token, "used": self.used,
             "block_table": list(block_table), "block_states": self.block_states}
        return d if role is None else {"role": role, **d}

    def stats(self) -> dict:
        """The pool as /api/stats lists it."""
        return {"name": self.name, "kv_cache_dtype": self.kv_cache_dtype, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "used": self.used, "cached": self.cached, "bytes": self.nbytes}


class KVCacheManager:
    """One model's paged KV cache in one dtype: a block pool, a store, and the sequences using them."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16,
                 kv_cache_dtype: str = "auto", enable_prefix_caching: bool = True, name: str = "target"):
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
        self.cfg, self.block_size, self.name = cfg, block_size, name
        self.dtype = resolve_kv_cache_dtype(kv_cache_dtype)
        self.pool = BlockPool(num_blocks, name, enable_prefix_caching)
        self.store = KVStore(cfg, num_blocks, block_size, self.dtype)
        self.bytes_per_token = kv_bytes_per_token(cfg, self.dtype)
        self.nbytes = num_blocks * block_size * self.bytes_per_token    # = store.nbytes() (fp8's scales aside)
        self.sequences: dict[int, Sequence] = {}
        self._ids = itertools.count()
        # prefix-cache statistics (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens)
        self.prefix_queries = 0
        self.prefix_hits = 0

    # --- sequences ------------------------------------------------------------------------------
    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(self.pool.name, self.dtype.name, self.block_size, self.pool.num_blocks,
                            self.pool.num_used_blocks, len(self.pool.cached), self.bytes_per_token,
                            self.pool.block_states(), self.nbytes)

    def release(self) -> None:
        """Drop the K/V numbers: the pool has been freed (engine/serving/pools.py). Its memory goes back at once,
        whoever still holds this manager (an ended generation's runner); a new sequence here raises."""
        if self.sequences:
            raise RuntimeError(f"KV pool '{self.name}' still holds {len(self.sequences)} sequences")
        self.store = None
        trim_freed_memory()

    @property
    def released(self) -> bool:
        return self.store is None

    def new_sequence(self) -> Sequence:
        if self.store is None:
            raise RuntimeError(f"KV pool '{self.name}' ({self.dtype.name}, block size {self.block_size}) was freed")
        max_tokens = self.cfg.max_position_embeddings
        seq = Sequence(next(self._ids), max_tokens,
                       slots=np.zeros(-(-max_tokens // self.block_size) * self.block_size, np.int64))
        self.sequences[seq.seq_id] = seq
        return seq

    def match_prefix(self, seq: Sequence, token_ids) -> int:
        """Share the cached full blocks that start `token_ids`; return how many tokens they hold.

        At least one token is always left to compute, because its logits are needed.
        """
        if seq.num_tokens:
            raise ValueError("match_prefix needs an empty sequence")
        bs = self.block_size
        self.prefix_queries += len(token_ids)
        ids = np.asarray(token_ids, dtype=np.int64)
        data, width = ids.tobytes(), bs * ids.itemsize     # converted once, not per block
        parent, hits = None, []
        for b in range((len(ids) - 1) // bs):
            h = hash_block_tokens(parent, data[b * width:(b + 1) * width])
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            self.pool.touch(block, seq.seq_id)
            hits.append(block)
            seq.block_hashes.append(h)
            parent = h
        self._append_blocks(seq, hits)
        seq.token_ids.extend(ids[:len(hits) * bs].tolist())
        self.prefix_hits += seq.num_tokens
        return seq.num_tokens

    def append_slots(self, seq: Sequence, token_ids) -> SequenceKV:
        """Make room for `token_ids` after the sequence's tokens; returns the KV view for forward."""
        n, p0, bs = len(token_ids), seq.num_tokens, self.block_size
        if n and seq.tree_start is not None:
            raise ValueError("a token tree's rows are pending: keep_tree_path before appending")
        if p0 + n > seq.max_tokens:
            raise ValueError(f"sequence would hold {p0 + n} tokens, more than the model's context "
                             f"of {seq.max_tokens} (max_position_embeddings)")
        need = -(-(p0 + n) // bs) - len(seq.blocks)
        if need > 0:
            last = seq.blocks[-1].block_id if seq.blocks else None
            self._append_blocks(seq, self.pool.get_new_blocks(need, seq.seq_id, after=last))
        seq.token_ids.extend(token_ids.tolist() if isinstance(token_ids, np.ndarray) else map(int, token_ids))
        if seq.contiguous:
            start = seq.blocks[0].block_id * bs
            return SequenceKV(self.store, slice(start + p0, start + p0 + n), slice(start, start + p0 + n))
        return SequenceKV(self.store, seq.slots[p0:p0 + n], seq.slots[:p0 + n])

    def append_tree_slots(self, seq: Sequence, token_ids) -> SequenceKV:
        """`append_slots` for a token tree's forward, whose rows (the root, then the nodes in node order) are
        scratch until `keep_tree_path`."""
        kv = self.append_slots(seq, token_ids)
        seq.tree_start = seq.num_tokens - len(token_ids)
        return kv

    def keep_tree_path(self, seq: Sequence, rows) -> None:
        """After a tree's forward: keep its rows `rows` (strictly increasing, a path from the root down), row
        rows[i] moving from position tree_start + rows[i] to tree_start + i with its token, K/V and scales, and
        free the rest. A path of rows 0, 1, .. moves nothing: it is a truncation."""
        start, rows = seq.tree_start, [int(r) for r in rows]
        if start is None:
            raise ValueError("no token tree pending: keep_tree_path follows append_tree_slots")
        if any(not 0 <= r < seq.num_tokens - start for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
            raise ValueError(f"rows {rows} are not a path of the tree's {seq.num_tokens - start} rows in order")
        moved = [(start + r, start + i) for i, r in enumerate(rows) if r != i]
        if moved:
            src, dst = (list(x) for x in zip(*moved))
            self.store.copy_slots(seq.slots[src], seq.slots[dst])
            for s, d in moved:
                seq.token_ids[d] = seq.token_ids[s]
        self.truncate(seq, start + len(rows))

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's full blocks in the prefix cache.

        NOTE: call only when every token held is final (verified): a speculative round commits after
        rolling back its rejected tokens, so no unverified token is ever cached.
        """
        if seq.tree_start is not None:
            raise RuntimeError("a token tree's scratch rows are pending: keep_tree_path before commit")
        bs = self.block_size
        for b in range(len(seq.block_hashes), seq.num_tokens // bs):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = hash_block_tokens(parent, seq.token_ids[b * bs:(b + 1) * bs])
            seq.block_hashes.append(h)
            self.pool.cache_full_block(seq.blocks[b], h, seq.seq_id)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll the sequence back to its first `num_tokens` tokens, freeing blocks that become empty."""
        if not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"cannot truncate a sequence of {seq.num_tokens} tokens to {num_tokens}")
        bs = self.block_size
        seq.tree_start = None                       # what is kept is the sequence now, a tree's rows included
        keep = -(-num_tokens // bs)
        if keep < len(seq.blocks):
            self.pool.free_blocks(seq.blocks[keep:], seq.seq_id)
            del seq.blocks[keep:]
            if not seq.contiguous:                  # the block that broke the run may be gone (a tree's scratch)
                seq.contiguous = all(a.block_id + 1 == b.block_id for a, b in zip(seq.blocks, seq.blocks[1:]))
        del seq.token_ids[num_tokens:]
        del seq.block_hashes[num_tokens // bs:]
        if num_tokens % bs and seq.blocks:
            last = seq.blocks[-1]
            if last.ref_cnt > 1:                    # shared: give this sequence its own copy
                self._copy_on_write_last_block(seq)
            elif last.block_hash is not None:       # about to be overwritten: drop it from the cache
                self.pool.uncache_block(last)

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence with the same tokens: full blocks shared, the partial last block copied."""
        child = self.new_sequence()
        for block in seq.blocks:
            self.pool.touch(block, child.seq_id)
        self._append_blocks(child, seq.blocks)
        child.token_ids = list(seq.token_ids)
        child.block_hashes = list(seq.block_hashes)
        child.tree_start = seq.tree_start
        if seq.num_tokens % self.block_size:
            self._copy_on_write_last_block(child)
        return child

    def free(self, seq: Sequence) -> None:
        self.pool.free_blocks(seq.blocks, seq.seq_id)
        seq.blocks.clear()
        seq.token_ids.clear()
        seq.block_hashes.clear()
        seq.tree_start = None
        self.sequences.pop(seq.seq_id, None)

    def check_invariants(self) -> None:
        """The pool's, and per sequence: blocks for its tokens and no more, each block referenced once per
        sequence holding it, `slots` and `contiguous` as the table says, only full blocks hashed, never a
        block that holds a tree's scratch rows (so only the last block may be partial, and it is not shared)."""
        self.pool.check_invariants()
        bs, refs = self.block_size, np.zeros(self.pool.num_blocks, np.int64)
        for seq in self.sequences.values():
            ids = np.array(seq.block_table, np.int64)
            assert len(ids) == -(-seq.num_tokens // bs), f"sequence {seq.seq_id}: {len(ids)} blocks"
            np.add.at(refs, ids, 1)
            assert (seq.slots[:len(ids) * bs] == (ids[:, None] * bs + np.arange(bs)).ravel()).all()
            assert seq.contiguous == bool((np.diff(ids) == 1).all()), f"sequence {seq.seq_id}: contiguous"
            full = seq.num_tokens // bs if seq.tree_start is None else seq.tree_start // bs
            assert len(seq.block_hashes) <= full, f"sequence {seq.seq_id}: unfinished blocks hashed"
            assert seq.tree_start is None or 0 <= seq.tree_start <= seq.num_tokens
            if seq.num_tokens % bs:
                assert seq.blocks[-1].ref_cnt == 1, f"sequence {seq.seq_id}: a shared partial block"
        assert refs.tolist() == [b.ref_cnt for b in self.pool.blocks], "block references out of step"

    # --- figures --------------------------------------------------------------------------------
    def bytes_used(self, seq: Sequence) -> int:
        return seq.num_tokens * self.bytes_per_token

    def bytes_allocated(self) -> int:
        return self.pool.num_used_blocks * self.block_size * self.bytes_per_token

    # --- internals ------------------------------------------------------------------------------
    def _append_blocks(self, seq: Sequence, blocks: list[Block]) -> None:
        if not blocks:
            return
        b, bs = len(seq.blocks), self.block_size
        ids = [block.block_id for block in blocks]
        chain = [seq.blocks[-1].block_id] + ids if seq.blocks else ids
        if any(x + 1 != y for x, y in zip(chain, chain[1:])):
            seq.contiguous = False
        seq.blocks.extend(blocks)
        seq.slots[b * bs:(b + len(ids)) * bs] = (np.array(ids)[:, None] * bs + np.arange(bs)).ravel()

    def _copy_on_write_last_block(self, seq: Sequence) -> None:
        old = seq.blocks.pop()
        new = self.pool.get_new_blocks(1, seq.seq_id)[0]
        bs = self.block_size
        self.store.copy_slots(slice(old.block_id * bs, (old.block_id + 1) * bs),
                              slice(new.block_id * bs, (new.block_id + 1) * bs))
        self.pool.free_blocks([old], seq.seq_id)
        seq.contiguous = all(a.block_id + 1 == b.block_id for a, b in zip(seq.blocks, seq.blocks[1:]))
        self._append_blocks(seq, [new])
