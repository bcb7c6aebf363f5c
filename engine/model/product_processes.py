"""Few-row weight products shared with helper processes, outside this process's GIL (the design: threads.py).

Each helper keeps a private copy of its fixed share of every weight, sent on the weight's first product; a product
costs a copy of its input rows to each helper's shared segment, a semaphore post each way and a copy back. A
helper late beyond PATIENCE times the caller's own part gets no new post till it has answered the late one: one
post, one answer, so an answer used is always to the latest post, and no buffer a helper may still read is written.

    far = ProductProcesses(helpers=1)
    far.rows(far.weight(w), x, out)  # x [n, C] @ panels [P, C, b] -> out [P, n, b]; or @ t.T, t [D, C] -> [n, D]
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

MAX_ROWS = 9                   # products of more rows (prefill chunks) go to the thread pool (layout.FEW_ROWS)
BLOCK_ROWS = 256               # an [out, in] share's rows a few-row product takes at a time (layout.BLOCK_ROWS)
X_FLOATS = MAX_ROWS * 8192     # a helper's input rows: up to MAX_ROWS rows of 8,192 inputs
OUT_FLOATS = MAX_ROWS * 65536  # its output: up to MAX_ROWS rows of 65,536 columns
ARENA_FLOATS = 16 << 20        # a helper's shares are carved from allocations of this size
SPIN_S = 0.02                  # a helper polls this long for its next post before it sleeps: a step's products
                               # follow each other far faster than a sleeping process wakes
PATIENCE, MIN_PATIENCE_S = 3.0, 100e-6   # a helper's part may take this many times the caller's own part
START_S = 60.0                 # the most a helper may take to start or to take a weight
REST, MAX_REST = 256, 2048     # products a late helper sits out (its core is likely taken for a while, and one
                               # polling holds a core the caller needs), twice the last rest if late again soon
OP, WEIGHT, ROWS = range(3)              # the control words of a helper's segment
PRODUCT, ATTACH, EXIT, CTRL_BYTES = 1, 2, 3, 64


def _views(buf):  # a helper's segment -> (control words: a memoryview, whose items are plain ints, x, out)
    x = np.ndarray(X_FLOATS, np.float32, buf, CTRL_BYTES)
    return buf[:CTRL_BYTES].cast("q"), x, np.ndarray(OUT_FLOATS, np.float32, buf, CTRL_BYTES + X_FLOATS * 4)


def part(w, x, out) -> None:
    """x [n, C] times a share of a weight into `out`: panels [P, C, b] -> out [P, n, b]; rows of an [out, in]
    matrix [R, C] -> out [n, R], one GEMV (one row) or block by block of BLOCK_ROWS rows, as layout.py does."""
    if w.ndim == 3:
        np.matmul(x, w, out=out)
    elif x.shape[0] == 1:
        np.dot(w, x[0], out=out[0])
    else:
        for a in range(0, w.shape[0], BLOCK_ROWS):
            for j in range(x.shape[0]):
                np.dot(w[a:a + BLOCK_ROWS], x[j], out=out[j, a:a + BLOCK_ROWS])


def part_views(w, n: int, xbuf, obuf) -> tuple:
    """`part`'s arguments for n rows times the share `w`: w, and x [n, C] and out as views of a helper's buffers."""
    shape = (w.shape[0], n, w.shape[2]) if w.ndim == 3 else (n, w.shape[0])
    c = w.shape[-2] if w.ndim == 3 else w.shape[1]
    return w, xbuf[:n * c].reshape(n, c), obuf[:math.prod(shape)].reshape(shape)


def _wait(work, parent: int) -> bool:
    """Take the next post: poll SPIN_S, then sleep on the semaphore a second at a time while the parent lives."""
    end = time.perf_counter() + SPIN_S
    while time.perf_counter() < end:
        if work.acquire(False):
            return True
    while not work.acquire(timeout=1.0):
        if os.getppid() != parent:
            return False
    return True


def serve(segment: str, inbox, work, done, parent: int) -> None:
    """A helper process: take weights' shares and compute parts till told to exit or its parent is gone (it stops
    within a second of its parent's death)."""
    shm = shared_memory.SharedMemory(segment)
    ctrl, xbuf, obuf = _views(shm.buf)
    shares, views, arena, used = {}, {}, None, 0
    done.release()                                   # started
    while _wait(work, parent) and ctrl[OP] != EXIT:
        if ctrl[OP] == ATTACH:
            # shares carved in arrival order from allocations numpy backs with huge pages, as the engine's own
            # weights: allocated one by one they would sit in small pages and stream slower than the caller's share
            index, shape = inbox.recv()
            n = math.prod(shape)
            if arena is None or used + n > len(arena):
                arena, used = np.empty(max(n, ARENA_FLOATS), np.float32), 0
            shares[index], used = arena[used:used + n].reshape(shape), used + -(-n // 16) * 16    # 64-byte lines
            inbox.recv_bytes_into(shares[index].reshape(-1))
        else:
            key = (ctrl[WEIGHT], ctrl[ROWS])
            if key not in views:
                views[key] = part_views(shares[key[0]], key[1], xbuf, obuf)
            part(*views[key])
        done.release()
    del ctrl, xbuf, obuf, views
    shm.close()


class _Helper:  # a helper process, its shared segment (control words, input rows, output), semaphores and pipe

    def __init__(self, ctx, number: int):
        self.shm = shared_memory.SharedMemory(create=True, size=CTRL_BYTES + (X_FLOATS + OUT_FLOATS) * 4)
        self.ctrl, self.x, self.out = _views(self.shm.buf)
        self.work, self.done = ctx.Semaphore(0), ctx.Semaphore(0)
        inbox, self.outbox = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=serve, args=(self.shm.name, inbox, self.work, self.done, os.getpid()),
                                   name=f"products-far-{number}", daemon=True)
        self.process.start()
        self.pending, self.gone = True, False       # a post (its start) not answered yet; given up for good
        self.rest, self.last_rest, self.since = 0, REST, REST   # products to sit out; the last rest; posts since
        started = self.wait(time.perf_counter() + START_S, sleep=True)
        self.shm.unlink()                            # both processes keep their mapping; nothing left in /dev/shm
        if not started:
            self.process.kill()
            raise RuntimeError(f"{self.process.name} did not start (a script needs `if __name__ == '__main__':`)")

    def post(self, op: int, weight: int = 0, rows: int = 0) -> None:
        self.ctrl[OP], self.ctrl[WEIGHT], self.ctrl[ROWS] = op, weight, rows
        self.pending = True
        self.work.release()

    def answered(self) -> bool:  # whether it has answered its last post: a look that never blocks
        if self.pending and self.done.acquire(False):
            self.pending = False
        return not self.pending

    def wait(self, deadline: float, sleep: bool = False) -> bool:
        """Whether it answers its last post by `deadline` (perf_counter), polling, or sleeping while it lives."""
        sleep = sleep or deadline == math.inf
        while not self.answered():
            if time.perf_counter() > deadline or sleep and not self.process.is_alive():
                return False
            if sleep and self.done.acquire(timeout=0.05):
                self.pending = False
        return True

    def give_up(self, why: str) -> None:
        self.gone = True
        self.process.kill()
        logger.warning("helper process %s %s: the caller computes its shares from now on", self.process.name, why)


@dataclass
class SharedWeight:
    w: np.ndarray            # panels [P, C, b] or an [out, in] matrix [D, C], as stored
    index: int               # its name in the helpers
    edges: list[int]         # share i is w[edges[i]:edges[i+1]]: the caller's share 0, helper i's share i


class ProductProcesses:
    """`helpers` processes that each compute a fixed share of few-row products, the caller share 0 with the odd
    units (a helper starts only once the caller has posted). One caller at a time."""

    def __init__(self, helpers: int, patience: float = PATIENCE):
        ctx = multiprocessing.get_context("spawn")
        self.helpers = [_Helper(ctx, i + 1) for i in range(helpers)]
        self.patience = patience     # math.inf: always wait for a live helper's answer (tests)
        self.parts = 0               # parts posted to helpers so far, and how many of them the caller computed
        self.taken_over = 0
        self._weights: dict[int, SharedWeight] = {}    # id(w) -> its entry, whose reference keeps ids unique
        self._plans: dict[tuple, list] = {}            # (weight, rows) -> the views its products use (Python's cost)
        self._lock = threading.Lock()

    def weight(self, w) -> SharedWeight | None:
        """`w` (panels or an [out, in] matrix) with each helper's share sent (once), or None where it cannot be
        shared (not float32, fewer panels or blocks than shares, MAX_ROWS rows of a share beyond OUT_FLOATS) or
        not now (a helper still on a late part: it is sent on a later product)."""
        if id(w) in self._weights:
            return self._weights[id(w)]
        align, helpers = (1 if w.ndim == 3 else BLOCK_ROWS), len(self.helpers)
        units = -(-w.shape[0] // align)
        each = units // (helpers + 1)                # a helper's units; the caller's share has the rest
        edges = [0] + [min(w.shape[0], (units - (helpers - i) * each) * align) for i in range(helpers)] + [w.shape[0]]
        columns = max(b - a for a, b in zip(edges, edges[1:])) * (w.shape[2] if w.ndim == 3 else 1)
        if w.dtype != np.float32 or each == 0 or MAX_ROWS * columns > OUT_FLOATS:
            return None
        with self._lock:
            if not all(h.gone or h.answered() for h in self.helpers):
                return None
            index = len(self._weights) + 1
            for h, a, b in zip(self.helpers, edges[1:], edges[2:]):
                try:            # through its pipe into its arena (a helper stopped meanwhile holds the caller here)
                    if not h.gone:
                        h.post(ATTACH)
                        h.outbox.send((index, w[a:b].shape))
                        h.outbox.send_bytes(np.ascontiguousarray(w[a:b]))
                    if h.gone or h.wait(time.perf_counter() + START_S, sleep=True):
                        continue
                except OSError:                      # it has died
                    pass
                h.give_up("did not take a weight")
            entry = self._weights[id(w)] = SharedWeight(w, index, edges)
        return entry

    def rows(self, entry: SharedWeight, x, out) -> None:
        """x [n, C] (float32, contiguous, n <= MAX_ROWS) times the weight into `out` ([P, n, b] or [n, D]). The
        caller polls while it waits: its CPU time is the product's time, as a shared clock needs."""
        w, n = entry.w, x.shape[0]
        cols = (lambda a, e: out[a:e]) if w.ndim == 3 else (lambda a, e: out[:, a:e])       # out for units a:e
        plan = self._plans.get((entry.index, n))
        if plan is None:                             # per helper: its views of x and of its output, its share
            plan = self._plans[entry.index, n] = [(h, *part_views(w[a:e], n, h.x, h.out)[1:], a, e)
                                     for h, a, e in zip(self.helpers, entry.edges[1:], entry.edges[2:])]
        with self._lock:
            posted, skipped = [], []
            for h, xs, result, a, e in plan:
                if h.gone or h.rest or not h.answered():     # given up, resting, or on a part it was late for
                    h.rest, h.since = max(0, h.rest - 1), 0
                    skipped.append((a, e))
                    continue
                h.since += 1
                xs[...] = x
                h.post(PRODUCT, entry.index, n)
                posted.append((h, result, a, e))
            self.parts += len(posted)
            t, mid = time.perf_counter(), entry.edges[1]
            part(w[:mid], x, cols(0, mid))
            deadline = time.perf_counter() + max(MIN_PATIENCE_S, self.patience * (time.perf_counter() - t))
            for h, result, a, e in posted:
                if h.wait(deadline):
                    cols(a, e)[...] = result
                    continue
                self.taken_over += 1
                h.rest = h.last_rest = min(MAX_REST, 2 * h.last_rest) if h.since < REST else REST
                skipped.append((a, e))
                if not h.process.is_alive():
                    h.give_up("has died")
            for a, e in skipped:                     # computed here
                part(w[a:e], x, cols(a, e))

    def close(self) -> None:
        self._plans.clear()                           # views of the segments: they must go before the segments
        for h in self.helpers:
            if h.process.is_alive():
                h.post(EXIT)
                h.process.join(timeout=2.0)
                h.process.kill()                      # where it was stopped, or still on a late part
            h.ctrl = h.x = h.out = None
            h.shm.close()
