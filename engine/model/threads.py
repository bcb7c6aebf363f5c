"""The weight products of models that stream from memory (SmolLM2) on N threads (`--threads N`): the design.

A decode step of SmolLM2-135M reads all of its float32 weights once, at the speed one core reads memory, and a
second core reads more at once (docs/benchmarks.md, `bench smollm2`); models within the CPU caches (our character
models) never use these threads. As llama.cpp splits an operation into (ith, nth) parts, by the product's size:
- few rows (a decode step, a verification: up to MAX_ROWS) go to N - 1 helper processes, each computing a fixed
  share while the caller computes its own (engine/model/product_processes.py): a helper thread would take its share
  through the GIL, a hand-off about as long as such a product, and a process has a GIL of its own;
- more rows (a prefill chunk), or a product the helper processes cannot take, are cut into chunks of about
  CHUNK_BYTES on a plain thread pool (numpy releases the GIL inside BLAS): helper threads take chunks from the
  front, the caller from the back, so no thread idles while one is left.
Each share or chunk is the same BLAS call on the same rows as in one thread, so every thread count gives the same
floats; a helper process that is late or gone has its share computed by the caller, so no result depends on
timing. OpenBLAS's own threads stay off: they split every product in halves and wait for both, and their count is
the whole process's, small models included. How many threads: engine/model/thread_choice.py.

    set_threads(2)                   # the process's pool for layout weights' products (1: no helpers)
    rows_product(x, w)               # x [n, C] @ a layout weight, on it
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from .product_processes import MAX_ROWS, X_FLOATS, ProductProcesses

logger = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20          # of weights per chunk on the thread pool: a hand-off is small beside streaming it


class ProductPool:
    """`threads - 1` helpers that share products with the calling thread: helper processes for few rows
    (`few_rows`), a thread pool for chunks (`run`). One caller at a time (the engine thread)."""

    def __init__(self, threads: int = 1):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.use_processes = threads > 1      # False: every product in chunks on the thread pool
        self._processes: ProductProcesses | None = None
        self._executor = ThreadPoolExecutor(threads - 1, "products") if threads > 1 else None

    def run(self, tasks: list) -> list:
        """Every task once, their results in order: the helpers take tasks from the front, the caller from the
        back (a task not begun yet is cancelled and run here), then it waits for those the helpers began."""
        if self._executor is None or len(tasks) < 2:
            return [task() for task in tasks]
        cpu = time.thread_time()
        futures = [self._executor.submit(lambda t=t: (time.thread_time(), t(), time.thread_time())) for t in tasks]
        mine = {i: tasks[i]() for i in reversed(range(len(tasks))) if futures[i].cancel()}
        theirs = {i: f.result() for i, f in enumerate(futures) if i not in mine}     # (CPU clock, result, CPU clock)
        helpers = sum(end - start for start, _, end in theirs.values()) / (self.threads - 1)
        _beyond.seconds = getattr(_beyond, "seconds", 0.0) + max(0.0, helpers - (time.thread_time() - cpu))
        return [mine[i] if i in mine else theirs[i][1] for i in range(len(tasks))]

    def few_rows(self, w, x, out) -> bool:
        """x [n, C] times a stored weight `w` (panels or [out, in]) into `out`, shared with the helper processes;
        False where they cannot take it."""
        far = self.processes() if x.shape[0] <= MAX_ROWS and x.dtype == np.float32 and x.size <= X_FLOATS else None
        entry = far.weight(w) if far is not None else None
        if entry is not None:
            far.rows(entry, np.ascontiguousarray(x), out)
        return entry is not None

    def processes(self) -> ProductProcesses | None:
        """The pool's helper processes (started on first use), or None: turned off or not able to run here."""
        if self.use_processes and self._processes is None:
            try:
                self._processes = ProductProcesses(self.threads - 1)
            except (OSError, RuntimeError) as e:   # no shared memory or no processes here: the thread pool only
                logger.warning("helper processes unavailable, products shared on threads: %s", e)
                self.use_processes = False
        return self._processes if self.use_processes else None

    def close(self) -> None:
        if self._processes is not None:
            self._processes.close()
            self._processes = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


_beyond = threading.local()      # per calling thread: helper threads' CPU time beyond its own (`shared_clock`)


def shared_clock() -> float:
    """The calling thread's CPU time plus, per product it shared with helper threads, their CPU time beyond its own
    (it polls for helper processes: there its CPU time is the product's): a product takes as long as its busiest
    thread, and no wait counts (for the GIL, a core). Engine time's clock for such models (engine/kv/runner.py)."""
    return time.thread_time() + getattr(_beyond, "seconds", 0.0)


_POOLS = {1: ProductPool(1)}      # one pool per thread count used so far
_POOL = _POOLS[1]
atexit.register(lambda: [p.close() for p in _POOLS.values()])     # helpers told to exit, segments closed


def set_threads(threads: int) -> ProductPool:
    """The process's pool for the products of layout weights: `threads` threads in all (the caller included)."""
    global _POOL
    if threads not in _POOLS:
        _POOLS[threads] = ProductPool(threads)
    _POOL = _POOLS[threads]
    return _POOL


def threads() -> int:
    return _POOL.threads


def pool() -> ProductPool:
    return _POOL


@contextmanager
def using_threads(threads: int):
    """`set_threads(threads)` for the block, the count before restored after it (a measurement per count)."""
    before = _POOL.threads
    try:
        yield set_threads(threads)
    finally:
        set_threads(before)


def chunk_edges(size: int, row_bytes: int, align: int, parts: int = 0) -> list[int]:
    """Edges 0 = e0 < e1 < ... = size of chunks of about CHUNK_BYTES (at least `parts` chunks where the size
    allows), every inner edge a multiple of `align`."""
    per = min(max(1, CHUNK_BYTES // max(row_bytes, 1)), -(-size // parts) if parts else size)
    per = max(align, -(-per // align) * align)
    return list(range(0, size, per)) + [size]


def vec_product(x, w):  # [C] @ a layout weight -> [D], on the pool (one thread: the layout's own)
    return w.vec(x) if _POOL.threads == 1 else w.vec(x, _POOL)


def rows_product(x, w):  # [n, C] @ a layout weight -> [n, D], on the pool
    return w.rows(x) if _POOL.threads == 1 else w.rows(x, _POOL)


def read_chunked(arrays, pool: ProductPool) -> None:
    """One pass over `arrays` (1-D), a BLAS dot of each chunk with itself, on the pool: the floor of a step."""
    tasks = []
    for v in arrays:
        edges = chunk_edges(len(v), v.itemsize, 1024, pool.threads)
        tasks += [lambda c=v[a:b]: np.dot(c, c) for a, b in zip(edges, edges[1:])]
    pool.run(tasks)
