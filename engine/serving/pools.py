"""The KV pools of a process, within a memory budget.

A pool is one KV cache manager per (model, cache dtype, block size), written in full when it is made (engine/kv/
cache.py) and sized for every session of the server. `kv_cache_dtype` and `block_size` are per-request settings,
so without a bound any client could make the server hold every combination at once (SmolLM2 at 16 sessions:
about 11.8 GiB) for the life of the process. Here every pool's bytes count against `budget`:

- A generation *claims* the pools its settings use (`PoolClaim.set`) before it makes or uses them: when it starts,
  and when it asks for a settings change (the pools of the new settings beside those it is using). A claimed pool is
  never freed, nor is one with a live sequence.
- A pool that is new and does not fit frees idle pools (no claim, no sequence), least recently used first, those
  made at start-up (`warm`) after the others; if the pools in use leave too little room the claim is refused with
  `PoolBudgetError` and nothing changes: the generation runs on as it was.
- The bytes of a claimed pool are reserved at once, so the pool is made later (a start's worker thread, a round
  boundary) without asking again; making happens outside the lock, once per key, as with `MadeOnce`.

NOTE (threads): claims come from any thread (a start's worker thread, the event loop's settings messages, the
engine thread); `made` may lose a pool from any of them, so other threads read it by copying
(`list(made.values())`). A freed pool's K/V arrays are dropped at once (`KVCacheManager.release`), even if an ended
generation still holds the manager.
"""
from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from typing import Callable

GIB, MIB = 2 ** 30, 2 ** 20


def human_bytes(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"


class PoolBudgetError(ValueError):
    """A pool that does not fit the KV memory budget beside the pools in use."""


class KVPools:
    def __init__(self, budget: int | None = None):
        self.budget = budget                       # bytes; None: unbounded
        self.made: dict = {}                       # key -> KVCacheManager
        self._sizes: dict = {}                     # key -> bytes, of pools made, being made or reserved by a claim
        self._claims: dict[int, frozenset] = {}    # claim id -> the keys it holds
        self._last_use: dict = {}                  # key -> tick of its last claim, release or use
        self._warm: set = set()                    # keys made at start-up: freed after the others
        self._making: dict = {}                    # key -> the lock its maker holds
        self._being_made: Counter = Counter()       # key -> threads in `get` making it or waiting for its maker
        self._lock = threading.Lock()
        self._tick = itertools.count()
        self._claim_ids = itertools.count(1)
        self._dropped: deque[int] = deque()        # claims of generations collected without closing
        self.freed = 0                             # pools freed to make room
        self.refused = 0                           # claims refused

    # --- figures (any thread) -------------------------------------------------------------------
    def held_bytes(self) -> int:
        """Bytes of the pools made (reservations of pools not made yet are not memory yet)."""
        return sum(self._sizes.get(k, 0) for k in list(self.made))

    # --- claims --------------------------------------------------------------------------------
    def claim(self) -> "PoolClaim":
        return PoolClaim(self, next(self._claim_ids))

    def _set_claim(self, claim_id: int, wants: dict) -> None:
        """The claim now holds exactly `wants` (key -> bytes); PoolBudgetError (and no change) if they do not fit."""
        with self._lock:
            self._forget_dropped()
            self._reserve(wants, claim_id)
            old = self._claims.get(claim_id, frozenset())
            self._claims[claim_id] = frozenset(wants)
            tick = next(self._tick)
            for key in old | set(wants):
                self._last_use[key] = tick
            self._drop_unused_reservations()

    def _release(self, claim_id: int) -> None:
        with self._lock:
            self._forget_dropped()
            self._release_locked(claim_id)

    def _release_locked(self, claim_id: int) -> None:
        old = self._claims.pop(claim_id, frozenset())
        tick = next(self._tick)
        for key in old:
            self._last_use[key] = tick
        self._drop_unused_reservations()

    def _forget_dropped(self) -> None:
        while self._dropped:
            self._release_locked(self._dropped.popleft())

    # --- pools ---------------------------------------------------------------------------------
    def get(self, key, nbytes: int, make: Callable[[], object], warm: bool = False):
        """The pool of `key`, made on first use (reserved first if no claim did: PoolBudgetError if it cannot fit);
        if another thread is making it, the one it makes."""
        pool = self.made.get(key)
        if pool is not None:
            self._last_use[key] = next(self._tick)
            return pool
        with self._lock:
            self._forget_dropped()
            if warm:
                self._warm.add(key)
            if key not in self._sizes:
                self._reserve({key: nbytes}, None)
            key_lock = self._making.setdefault(key, threading.Lock())
            self._being_made[key] += 1
        try:
            with key_lock:
                if key not in self.made:
                    made = make()
                    with self._lock:
                        self._sizes[key] = nbytes
                        self.made[key] = made
                        self._last_use[key] = next(self._tick)
                return self.made[key]
        finally:
            with self._lock:
                self._being_made[key] -= 1
                if not self._being_made[key]:
                    del self._being_made[key]
                if key not in self.made:           # the make raised: nothing stays reserved for it
                    self._drop_unused_reservations()

    # --- internals (under self._lock) -------------------------------------------------------------
    def _claimed(self, besides: int | None = None) -> set:
        return {k for cid, keys in list(self._claims.items()) if cid != besides for k in keys}

    def _idle(self, key, claimed: set) -> bool:
        pool = self.made.get(key)
        return (key not in claimed and key not in self._being_made
                and (pool is None or (not pool.sequences and pool.pool.num_used_blocks == 0)))

    def _reserve(self, wants: dict, claim_id: int | None) -> None:
        new = {k: n for k, n in wants.items() if k not in self._sizes}
        if not new:
            return
        need = sum(new.values())
        if self.budget is not None:
            claimed = self._claimed(claim_id) | set(wants)
            idle = sorted((k for k in self._sizes if self._idle(k, claimed)),
                          key=lambda k: (k in self._warm, self._last_use.get(k, -1)))
            held = sum(self._sizes.values())
            room = self.budget - held + sum(self._sizes[k] for k in idle)
            if need > room:
                self.refused += 1
                key, n = max(new.items(), key=lambda kv: kv[1])
                in_use = held - sum(self._sizes[k] for k in idle)
                why = ("more than all of it" if need > self.budget else
                       f"{human_bytes(in_use)} of it is held by pools in use; try again when generations end")
                raise PoolBudgetError(
                    f"its KV pool ({key[0]}, {key[1]}, block size {key[2]}: {human_bytes(n)}) does not fit the "
                    f"server's KV cache memory of {human_bytes(self.budget)} (serve --kv-cache-memory): {why}")
            for k in idle:
                if self.budget - sum(self._sizes.values()) >= need:
                    break
                self._free(k)
        self._sizes.update(new)

    def _free(self, key) -> None:
        del self._sizes[key]
        pool = self.made.pop(key, None)
        if pool is not None:
            pool.release()
            self.freed += 1

    def _drop_unused_reservations(self) -> None:
        """Reservations of pools never made whose claims have gone (a settings change replaced by another)."""
        claimed = self._claimed()
        for k in [k for k in self._sizes if k not in self.made and k not in claimed and k not in self._being_made]:
            del self._sizes[k]


class PoolClaim:
    """The pools one generation holds (see the module docstring). Released when the generation closes."""

    def __init__(self, pools: KVPools, claim_id: int):
        self.pools, self.id = pools, claim_id

    def set(self, wants: dict) -> None:
        """Hold exactly these pools (key -> bytes); PoolBudgetError if a new one cannot fit, and then no change."""
        self.pools._set_claim(self.id, wants)

    def release(self) -> None:
        self.pools._release(self.id)

    def dropped(self) -> None:
        """The generation was collected without closing: released at the next claim or use. (The garbage collector
        may call this inside any allocation, even one under the pools' lock, so it takes no lock.)"""
        self.pools._dropped.append(self.id)
