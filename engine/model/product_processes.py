"""Parts of a weight's few-row products computed in helper processes, outside this process's GIL.

A decode step of SmolLM2 is 121 products, 120 of them 1.3-7 MB. Helper threads (engine/model/threads.py) hand a
product's chunks over through the GIL and a lock, about 0.1 ms a hand-off, as long as a small product streams:
two threads made a step only 1.1-1.2x as fast while a bare read of the weights is 1.8x. A helper process has a
GIL of its own: it waits spinning on a semaphore (sem_trywait, no system call) and starts a part within
microseconds, so every product of a step can be split (docs/benchmarks.md, `bench smollm2`).

Each helper holds its own copy of its share of every weight it has been given, in private memory (huge pages,
as the engine's own buffer: weights in shared memory sit in small pages and stream 13-22% slower). The weights a
helper needs are sent once, on the first product that needs them (`weight`). A product then costs a copy of its
few input rows to shared memory, two semaphore posts and a copy of the helper's output columns back.

    far = ProductProcesses(helpers=1)
    entry = far.weight(panels)      # None where the helpers cannot take it
    far.rows(entry, x, out)         # x [n, C] @ panels [P, C, b] -> out [P, n, b], split by whole panels
    far.rows(far.weight(t), x, out) # x [n, C] @ t.T, t [D, C] -> out [n, D], split by blocks of 256 rows

A helper starts its part some tens of microseconds after the caller starts its own, and on some hosts streams
a little slower: equal shares kept the caller waiting a quarter of a 2-thread step. So where the caller's share
ends moves, per weight shape and row count, inside helper 1's share, by whole units (panels, blocks), half-way
after each product to where both would have finished together at the rates they had (`_next_mid`).

A helper late beyond PATIENCE times the caller's own part (it lost its core) has its part computed by the caller,
as with threads; a helper that died is noticed there and the far path is switched off (`alive`). Where the caller
waited longer than its own part took in more than SLOW of recent products (the helpers share their cores with
something), the next products run on the caller alone (`keeping_up`), then sharing is tried again: REST of them,
twice as many as last time where the helpers fell behind again within RECENT shared products (a core taken for
seconds, by a browser beside the server, would otherwise cost the caller a wait every few steps), at most
MAX_REST; not where they slept meanwhile (no part for SPIN_S: a prefill, a bench's other thread count), as
their first parts after a wake are slow anyway. Each part is the same BLAS call on the same panels or rows as in
one thread, so the floats are the same. Helpers exit with this process: daemonic, and a helper whose parent has
gone stops within a second.
"""
from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

logger = logging.getLogger(__name__)

MAX_ROWS = 9                   # products of more rows (prefill chunks) stay on threads (layout.FEW_ROWS)
BLOCK_ROWS = 256               # an [out, in] share's rows a few-row product takes at a time (layout.BLOCK_ROWS)
ARENA_FLOATS = 16 << 20        # 64 MB: a helper's weight shares are carved from allocations of this size
X_FLOATS = MAX_ROWS * 8192     # a helper's input rows: up to MAX_ROWS rows of 8,192 inputs
OUT_FLOATS = MAX_ROWS * 65536  # its output: up to MAX_ROWS rows of 65,536 columns
SPIN_S = 0.02                  # a helper spins this long for the next part before it sleeps (a step's gaps are ~ms)
PATIENCE = 3.0                 # a helper's part may take this many times the caller's own part
MIN_PATIENCE_S = 100e-6
START_S = 60.0                 # the most a helper may take to start or to take a weight
SLOW, SLOW_AVERAGING = 0.25, 1 / 32   # beyond this share of recent products slow, the caller rests its helpers
REST = 256                     # products (about two decode steps) run alone before sharing is tried again
RECENT, MAX_REST = 256, 2048    # falling behind again within RECENT shared products doubles the rest, up to this

SEQ, OP, INDEX, ROWS, DONE, CPU_NS, NDIM, SHAPE = range(8)          # SHAPE: up to 3 slots
START = SHAPE + 3                                                   # where in its share a part starts
PRODUCT, ATTACH, EXIT = 1, 2, 3
CTRL_BYTES, NAME_BYTES = 128, 128


def _segment_views(buf):  # a helper's shared segment -> (ctrl [16] int64, name bytes, x, out)
    ctrl = buf[:CTRL_BYTES].cast("q")     # a memoryview: its items are Python ints, read and written in ~30 ns
    name = np.ndarray(NAME_BYTES, np.uint8, buf, CTRL_BYTES)
    x = np.ndarray(X_FLOATS, np.float32, buf, CTRL_BYTES + NAME_BYTES)
    out = np.ndarray(OUT_FLOATS, np.float32, buf, CTRL_BYTES + NAME_BYTES + X_FLOATS * 4)
    return ctrl, name, x, out


def write_post(ctrl, seq: int, op: int, index: int, rows: int, start: int = 0) -> None:
    """Post `seq`. A helper still on a late part may read meanwhile: SEQ is -1 while the fields change (x86 and
    CPython keep these stores in order)."""
    ctrl[SEQ] = -1
    ctrl[OP], ctrl[INDEX], ctrl[ROWS], ctrl[START] = op, index, rows, start
    ctrl[SEQ] = seq


def read_post(ctrl) -> tuple[int, int, int, int, int] | None:
    """(seq, op, index, rows, start) of the post in `ctrl`, or None where it changed while being read."""
    seq = int(ctrl[SEQ])
    op, index, rows, start = int(ctrl[OP]), int(ctrl[INDEX]), int(ctrl[ROWS]), int(ctrl[START])
    return None if seq < 0 or int(ctrl[SEQ]) != seq else (seq, op, index, rows, start)


def part(w, x, out) -> None:
    """x [n, C] times a share of a weight, into `out`: panels [P, C, b] -> out [P, n, b]; rows of an [out, in]
    matrix [R, C] -> out [n, R], one GEMV (one row) or block by block of BLOCK_ROWS rows, as layout.py does."""
    if w.ndim == 3:
        np.matmul(x, w, out=out)
    elif x.shape[0] == 1:
        np.dot(w, x[0], out=out[0])
    else:
        for a in range(0, w.shape[0], BLOCK_ROWS):
            block = w[a:a + BLOCK_ROWS]
            for j in range(x.shape[0]):
                np.dot(block, x[j], out=out[j, a:a + len(block)])


def part_views(w, n: int, xbuf, obuf) -> tuple:
    """`part`'s arguments for n rows times `w` (a share from where it starts): w, x [n, C] and out as views of
    a helper's input and output buffers."""
    shape = (w.shape[0], n, w.shape[2]) if w.ndim == 3 else (n, w.shape[0])
    c = w.shape[-2] if w.ndim == 3 else w.shape[1]
    return w, xbuf[:n * c].reshape(n, c), obuf[:math.prod(shape)].reshape(shape)


def _wait(work, parent: int) -> bool:
    """Take the next part: spin SPIN_S, then sleep on the semaphore a second at a time while the parent lives.
    The spin does not yield the core: a helper that did started late on every product (docs/benchmarks.md)."""
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        if work.acquire(False):
            return True
    while not work.acquire(timeout=1.0):
        if os.getppid() != parent:
            return False
    return True


class Arena:
    """Homes for a helper's weight shares, carved in the order they arrive (a step's reading order: each is sent
    on its first product) from allocations of ARENA_FLOATS. numpy backs allocations of 4 MB or more with huge
    pages; shares of 0.6-3.5 MB allocated one by one sit in small pages, and a helper streamed them so much
    slower than the engine thread its own share that the engine thread waited for it on every product."""

    def __init__(self, floats: int = ARENA_FLOATS):
        self.floats, self.buf, self.used = floats, None, 0

    def take(self, shape: tuple) -> np.ndarray:
        n = int(np.prod(shape))
        if n >= self.floats:
            return np.empty(shape, np.float32)
        if self.buf is None or self.used + n > self.floats:
            self.buf, self.used = np.empty(self.floats, np.float32), 0
        out = self.buf[self.used:self.used + n].reshape(shape)
        self.used += -(-n // 16) * 16                # the next share starts on a 64-byte line
        return out


def serve(segment: str, work, done, parent: int) -> None:
    """A helper process: attach weights' shares and compute parts until told to exit or the parent is gone."""
    shm = shared_memory.SharedMemory(segment)
    ctrl, name, xbuf, obuf = _segment_views(shm.buf)
    shares: dict[int, np.ndarray] = {}
    views: dict[tuple, tuple] = {}                   # (index, start, rows) -> `part`'s arguments (`part_views`)
    arena = Arena()
    last = 0
    done.release()                                   # started
    while _wait(work, parent):
        post = read_post(ctrl)
        if post is None or post[0] == last:          # being written (its release follows), or done
            continue
        seq, op, index, rows, start = post
        if op == EXIT:
            break
        if op == ATTACH:
            src = shared_memory.SharedMemory(bytes(name).rstrip(b"\0").decode())
            shape = tuple(ctrl[SHAPE:SHAPE + ctrl[NDIM]])
            share = arena.take(shape)                # private, in huge pages like the engine's buffer
            share[...] = np.ndarray(shape, np.float32, src.buf)
            shares[index] = share
            src.close()
        elif op == PRODUCT:
            cpu = time.thread_time()
            args = views.get((index, start, rows))
            if args is None:
                args = views[index, start, rows] = part_views(shares[index][start:], rows, xbuf, obuf)
            part(*args)
            ctrl[CPU_NS] = int((time.thread_time() - cpu) * 1e9)
        last = seq
        ctrl[DONE] = seq
        done.release()
    del ctrl, name, xbuf, obuf
    shm.close()


class _Helper:
    def __init__(self, ctx, number: int):
        size = CTRL_BYTES + NAME_BYTES + (X_FLOATS + OUT_FLOATS) * 4
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.ctrl, self.name, self.x, self.out = _segment_views(self.shm.buf)     # a new segment is zeros
        self.work, self.done = ctx.Semaphore(0), ctx.Semaphore(0)
        self.process = ctx.Process(target=serve, args=(self.shm.name, self.work, self.done, os.getpid()),
                                   name=f"products-far-{number}", daemon=True)
        self.process.start()
        self.seq = 0
        started = self.answered(0, time.perf_counter() + START_S)
        self.shm.unlink()                             # both processes keep their mapping; nothing left in /dev/shm
        if not started:
            self.process.kill()
            raise RuntimeError(f"helper process {self.process.name} did not start (exit code "
                               f"{self.process.exitcode}; a script that uses it needs `if __name__ == '__main__':`)")

    def answered(self, seq: int, deadline: float) -> bool:
        """Whether the helper has answered `seq` (0: its start) by `deadline`, sleeping while it lives."""
        while True:
            if self.done.acquire(timeout=0.05):
                if self.ctrl[DONE] == seq:
                    return True
            elif not self.process.is_alive() or time.perf_counter() > deadline:
                return False

    def post(self, op: int, index: int = 0, rows: int = 0, start: int = 0) -> int:
        self.seq += 1
        write_post(self.ctrl, self.seq, op, index, rows, start)
        self.work.release()
        return self.seq

    def finished(self, seq: int, deadline: float) -> int:
        """How many looks part `seq` took to be done (1: done when first looked at), spinning, or 0 where it was
        not done by `deadline` (perf_counter); a stale part's post is consumed."""
        looks = 0
        while True:
            looks += 1
            if self.done.acquire(False):
                if self.ctrl[DONE] == seq:
                    return looks
                continue
            if time.perf_counter() > deadline:
                return 0


@dataclass
class SharedWeight:
    w: np.ndarray            # panels [P, C, b] or an [out, in] matrix [D, C], as stored
    index: int               # its name in the helpers
    edges: list[int]         # the caller's share is edges[0]:edges[1], helper i's edges[i+1]:edges[i+2]
    max_rows: int            # the most rows a product of it may have here (the helpers' output buffers)


class ProductProcesses:
    """`helpers` helper processes that each compute a share of a weight's output for few-row products, the
    caller computing the first share. A weight is stored as engine/model/layout.py stores it: panels [P, C, b]
    (shares of whole panels) or an [out, in] matrix [D, C] (shares of whole BLOCK_ROWS-row blocks). One caller
    at a time."""

    def __init__(self, helpers: int):
        ctx = multiprocessing.get_context("spawn")
        self.helpers = [_Helper(ctx, i + 1) for i in range(helpers)]
        self.alive = True
        self.products = 0            # products shared so far, and how many of them a helper was late for
        self.late = 0
        self.cpu_beyond = 0.0        # seconds of the helpers' CPU beyond the caller's, summed (a shared clock)
        self.slow = 0.0              # recent products' share in which the caller waited longer than its own part
        self.resting = 0             # products left to run on the caller alone (`keeping_up`)
        self.rest = REST             # the last rest's length
        self.shared = RECENT         # products shared since the last rest
        self.slept = False           # and whether the helpers have slept in between (no part for SPIN_S)
        self.posted_at = 0.0         # when the last product was posted
        self._weights: dict[int, tuple] = {}    # id(w) -> (w, index, edges); the reference keeps ids unique
        self._mids: dict[tuple, int] = {}       # (weight's shape, rows) -> where the caller's share ends now
        self._plans: dict[tuple, tuple] = {}    # (weight's index, rows, mid) -> `_plan`
        self._lock = threading.Lock()

    def weight(self, w) -> SharedWeight | None:
        """`w` (panels or an [out, in] matrix) with each helper's share sent (once), or None where it cannot be
        shared (not float32, fewer panels or blocks than parts)."""
        entry = self._weights.get(id(w))
        if entry is not None and entry.w is w:
            return entry
        align, parts = (1 if w.ndim == 3 else BLOCK_ROWS), len(self.helpers) + 1
        units = -(-w.shape[0] // align)
        if w.dtype != np.float32 or units < parts or not self.alive:
            return None
        with self._lock:
            return self._attach(w, [min(w.shape[0], units * i // parts * align) for i in range(parts + 1)])

    def _attach(self, w, edges: list[int]) -> SharedWeight:
        index = len(self._weights) + 1
        for h, (a, b) in zip(self.helpers, zip(edges[1:], edges[2:])):
            share = w[a:b]
            src = shared_memory.SharedMemory(create=True, size=share.nbytes)
            try:
                np.ndarray(share.shape, np.float32, src.buf)[...] = share
                h.name[:] = 0
                h.name[:len(src.name)] = np.frombuffer(src.name.encode(), np.uint8)
                h.ctrl[NDIM] = share.ndim
                for i, d in enumerate(share.shape):
                    h.ctrl[SHAPE + i] = d
                if not h.answered(h.post(ATTACH, index), time.perf_counter() + START_S):
                    self.alive = False
                    raise RuntimeError(f"helper process {h.process.name} did not take a weight (exit code "
                                       f"{h.process.exitcode})")
            finally:
                src.close()
                src.unlink()
        columns = max(b - a for a, b in zip(edges, edges[1:])) * (w.shape[2] if w.ndim == 3 else 1)
        entry = self._weights[id(w)] = SharedWeight(w, index, edges, min(MAX_ROWS, OUT_FLOATS // columns))
        return entry

    def rows(self, entry: SharedWeight, x, out):  # x [n, C] times the weight -> out ([P, n, b] or [n, D])
        w, edges, n = entry.w, entry.edges, x.shape[0]      # n <= entry.max_rows, x float32 and contiguous
        flat = x.reshape(-1)
        panels = w.ndim == 3
        key = (w.shape, n)
        with self._lock:
            self.products += 1
            mid = self._mids.get(key, edges[1])              # the caller's share ends here, in helper 1's share
            mine, theirs = self._plan(entry, n, mid)
            now = time.perf_counter()
            if self.shared and now - self.posted_at > SPIN_S:
                self.slept = True
            self.posted_at = now
            seqs = []
            for h, start, _, _, _, xs in theirs:
                xs[...] = flat
                seqs.append(h.post(PRODUCT, entry.index, n, start))
            t = time.perf_counter()
            part(mine, x, out[:mid] if panels else out[:, :mid])
            own = time.perf_counter() - t
            deadline = t + own + max(MIN_PATIENCE_S, PATIENCE * own)
            helper_cpu = 0.0
            for i, ((h, _, a, e, result, _), seq) in enumerate(zip(theirs, seqs)):
                looks = h.finished(seq, deadline)
                if looks:
                    cpu = h.ctrl[CPU_NS] / 1e9
                    if i == 0:                        # its time: till the caller saw it done, if it waited
                        took = time.perf_counter() - t if looks > 1 else cpu
                        self._mids[key] = self._next_mid(edges, mid, panels, own, took)
                    if panels:
                        out[a:e] = result
                    else:
                        out[:, a:e] = result
                    helper_cpu = max(helper_cpu, cpu)
                else:                                 # late: this share here; the helper's result is dropped
                    self.late += 1
                    part(w[a:e], x, out[a:e] if panels else out[:, a:e])
                    if not h.process.is_alive():
                        self.alive = False
                        logger.warning("helper process %s has died: products run on threads from now on",
                                       h.process.name)
            # the caller spins while it waits, so its CPU time is its wall time here
            wall = time.perf_counter() - t
            self.cpu_beyond += max(0.0, helper_cpu - wall)
            self.slow += ((wall > 2 * own) - self.slow) * SLOW_AVERAGING
            self.shared += 1
            if self.slow > SLOW:
                again = self.shared < RECENT and not self.slept
                self.rest = min(MAX_REST, 2 * self.rest) if again else REST
                self.resting, self.slow, self.shared, self.slept = self.rest, 0.0, 0, False
            return out

    @staticmethod
    def _next_mid(edges: list[int], mid: int, panels: bool, own: float, helper: float) -> int:
        """Where the caller's share ends next time: half-way to where the caller (`own` seconds for its share)
        and helper 1 (`helper` seconds for the rest of its share) would have finished together at their rates
        this time, by whole units, inside helper 1's share. Half-way: one product's times are noisy; whole
        way at once: a weight in one product a step, the LM head, would take hundreds of steps a unit at a
        time."""
        unit = 1 if panels else BLOCK_ROWS
        caller_rate, helper_rate = mid / max(own, 1e-9), (edges[2] - mid) / max(helper, 1e-9)
        balanced = edges[2] * caller_rate / (caller_rate + helper_rate)
        units = int((balanced - mid) / 2 / unit)     # toward zero: no move for less than two units off
        return min(edges[2] - unit, max(edges[1], mid + units * unit))

    def keeping_up(self) -> bool:
        """Whether the next product should be shared: not while resting after the helpers fell behind."""
        if self.resting:
            self.resting -= 1
            return False
        return True

    def _plan(self, entry: SharedWeight, n: int, mid: int) -> tuple:
        """The caller's share of `entry` for n rows when its share ends at `mid`, and per helper (helper, where
        its part starts in its share, the part's first and last unit in the weight, its output as a view of
        the helper's buffer shaped as that part of `out`, its input as a flat view of its buffer). Kept: a
        product's Python costs microseconds too."""
        plan = self._plans.get((entry.index, n, mid))
        if plan is None:
            w, edges = entry.w, entry.edges
            starts = [mid] + edges[2:-1]
            theirs = []
            for i, h in enumerate(self.helpers):
                a, e = starts[i], edges[i + 2]
                _, xs, result = part_views(w[a:e], n, h.x, h.out)
                theirs.append((h, a - edges[i + 1], a, e, result, xs.reshape(-1)))
            plan = self._plans[entry.index, n, mid] = (w[:mid], theirs)
        return plan

    def close(self) -> None:
        self._plans.clear()                           # views of the segments: they must go before the segments
        for h in self.helpers:
            if h.process.is_alive():
                h.post(EXIT)
                h.process.join(timeout=2.0)
            h.ctrl = h.name = h.x = h.out = None
            h.shm.close()
        self.alive = False


