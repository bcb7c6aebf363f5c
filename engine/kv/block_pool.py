"""The block pool: metadata for every KV block of one model's cache (after vLLM's BlockPool).

It holds no K or V, only who uses which block: ids, reference counts and prefix-cache hashes. The
numbers live in `engine.kv.store.KVStore`, indexed by the same block ids.

NOTE (invariants, checked by `check_invariants` and the property test):
- every block is either in the free queue (ref_cnt == 0) or in use (ref_cnt > 0), never both;
- a free block may keep its hash so a later identical prefix can revive it (a prefix-cache hit);
  it is evicted from the cache only when the block is handed out for new content;
- `cached` maps each hash to exactly one block whose `block_hash` is that hash.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class KVCacheFullError(RuntimeError):
    """The pool has fewer free blocks than a request needs (the seed's 'cache overflow')."""


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    prev_id: int | None = None      # the block before it in the table it was handed out to (get_new_blocks)


class BlockEvent(NamedTuple):   # a tuple: made per block and round, cheaper than a frozen dataclass
    kind: str          # allocate | share | cache_hit | cache | free | evict
    block_id: int
    pool: str
    seq_id: int | None = None


def hash_block_tokens(parent_hash: bytes | None, token_ids) -> bytes:
    """A hash chained over the parent block's hash and this block's tokens (vLLM's prefix key)."""
    data = token_ids if isinstance(token_ids, bytes) else np.asarray(token_ids, dtype=np.int64).tobytes()
    return hashlib.sha256((parent_hash or b"root") + data).digest()


class BlockPool:
    def __init__(self, num_blocks: int, name: str = "target", enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.name = name
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (least recently freed first). An OrderedDict gives O(1) removal
        # from the middle when a cached free block is revived (vLLM uses a doubly linked list).
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[bytes, Block] = {}
        self.events: list[BlockEvent] = []
        # block_states() kept up to date block by block (`_mark` after every change): building it anew from
        # the blocks would cost one string per session and round, on the engine thread, for every block
        self._states = bytearray(b"f" * num_blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def get_new_blocks(self, n: int, seq_id: int | None = None, after: int | None = None) -> list[Block]:
        """n blocks from the free queue, least recently used first.

        `after`: the id of the block that precedes the new ones in a block table. When the next id is
        free it is taken instead of the queue's head, so that a table stays one run of consecutive blocks:
        attention then reads K/V as a slice, not a gather (engine.kv.cache). It is taken if it holds no
        cached prefix (as good as any other block: eviction order is unchanged), or if it was handed out
        right after `after` before: then its cached content continues `after`'s chain as an earlier
        sequence wrote it (a re-run of a prompt: the prompt's blocks are hits, the rest of the last run
        follows them), a hit only for a request that repeats that sequence, and evicting it out of LRU order
        keeps the re-run's table one slice, which a decode step reads without a gather's copy.
        """
        if n > len(self.free_queue):
            raise KVCacheFullError(
                f"KV cache pool '{self.name}' is exhausted: {n} more blocks needed, "
                f"{len(self.free_queue)} of {self.num_blocks} free")
        out = []
        for _ in range(n):
            nxt = None if after is None else after + 1
            if nxt is not None and nxt in self.free_queue and (self.blocks[nxt].block_hash is None
                                                              or self.blocks[nxt].prev_id == after):
                block = self.free_queue.pop(nxt)
            else:
                _, block = self.free_queue.popitem(last=False)
            block.prev_id, after = after, block.block_id
            if block.block_hash is not None:       # reuse for new content: forget the old prefix
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                self.events.append(BlockEvent("evict", block.block_id, self.name, seq_id))
                block.block_hash = None
            block.ref_cnt = 1
            self._mark(block)
            self.events.append(BlockEvent("allocate", block.block_id, self.name, seq_id))
            out.append(block)
        return out

    def get_cached_block(self, block_hash: bytes) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, block: Block, seq_id: int | None = None) -> None:
        """Take one more reference to a block (a prefix-cache hit, or a fork)."""
        if block.ref_cnt == 0:
            del self.free_queue[block.block_id]
            self.events.append(BlockEvent("cache_hit", block.block_id, self.name, seq_id))
        else:
            self.events.append(BlockEvent("share", block.block_id, self.name, seq_id))
        block.ref_cnt += 1
        self._mark(block)

    def cache_full_block(self, block: Block, block_hash: bytes, seq_id: int | None = None) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:              # same content computed twice: keep the first
            return
        block.block_hash = block_hash
        self._mark(block)
        self.cached[block_hash] = block
        self.events.append(BlockEvent("cache", block.block_id, self.name, seq_id))

    def uncache_block(self, block: Block) -> None:
        """Forget a block's prefix hash (its content is about to change)."""
        if block.block_hash is not None and self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None
        self._mark(block)

    def free_blocks(self, blocks, seq_id: int | None = None) -> None:
        """Drop one reference to each block; a block reaching zero returns to the free queue.

        Blocks are freed in reverse so that a sequence's tail is evicted before its shared prefix.
        """
        for block in reversed(list(blocks)):
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id} in pool '{self.name}'")
            block.ref_cnt -= 1
            self._mark(block)
            if block.ref_cnt == 0:                  # a cached block keeps its hash until evicted
                self.free_queue[block.block_id] = block
                self.events.append(BlockEvent("free", block.block_id, self.name, seq_id))

    @staticmethod
    def _state_of(b: Block) -> int:
        return (b"s" if b.ref_cnt > 1 else b"u" if b.ref_cnt else b"c" if b.block_hash else b"f")[0]

    def _mark(self, b: Block) -> None:
        # _state_of's letters as bytes, inline: this runs for every block change (a prefix hit of 24 blocks
        # and its free: 56 calls); check_invariants compares the two
        self._states[b.block_id] = 115 if b.ref_cnt > 1 else 117 if b.ref_cnt else 99 if b.block_hash else 102

    def block_states(self) -> str:
        """One letter per block: f free, c cached (free, prefix kept), u used, s shared (ref_cnt > 1)."""
        return self._states.decode("ascii")

    def drain_events(self, owners=None) -> list[BlockEvent]:
        """Take the events recorded so far: all, or those of `owners` ({(pool, seq_id)}: one session's
        sequences, when several sessions share the pool), leaving the others' for them."""
        if owners is None or not self.events:
            events, self.events = self.events, []
            return events
        mine = [(e.pool, e.seq_id) in owners for e in self.events]
        events = [e for e, m in zip(self.events, mine) if m]
        self.events = [e for e, m in zip(self.events, mine) if not m]
        return events

    def check_invariants(self) -> None:
        for b in self.blocks:
            in_free = b.block_id in self.free_queue
            assert (b.ref_cnt == 0) == in_free, f"block {b.block_id}: ref_cnt {b.ref_cnt}, free={in_free}"
            assert b.ref_cnt >= 0
        for h, b in self.cached.items():
            assert b.block_hash == h, f"cached hash points at block {b.block_id} with another hash"
        assert self._states == bytes(self._state_of(b) for b in self.blocks), "block_states out of step"
