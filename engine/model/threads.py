"""The weight products of memory-bound models on several threads (`--threads N`), and the measurement that
picks N on the machine it runs on.

A decode step of SmolLM2-135M reads all 538 MB of its float32 weights: it runs at the speed one core reads
memory, and a second core reads more of it at once (docs/benchmarks.md, `bench smollm2`). Models whose weights
sit in the CPU cache (our character models) are bound by numpy's per-call overhead instead; they never use
these threads.

How: a pool of N - 1 helpers, two kinds by the size of the product.
- A product of few rows (a decode step, a verification: up to 9 rows) is split into N shares, the calling
  thread's and one per helper process (engine/model/product_processes.py). A helper process waits outside this
  process's GIL and starts its share within microseconds, so every one of a step's 121 products can be split;
  helper threads pay about 0.1 ms a hand-off, as long as most of those products take (docs/benchmarks.md,
  `bench smollm2`). Each helper process holds its own copy of its share of the weights: (N - 1) / N of them.
- A larger product (a prefill chunk), or any product where helper processes cannot run, is cut into chunks of
  about `CHUNK_BYTES` of weights (blocks of 256 rows of an [out, in] matrix, runs of panels); the calling
  thread and N - 1 helper threads take chunks from one counter until none is left, and the caller waits only
  for chunks a helper has already begun. numpy releases the GIL inside BLAS, so the threads stream at once.

A helper that gets no core (a browser, the event loop, another process) is taken over: the caller computes
what it has not, and the step falls back towards one thread's time instead of waiting for it; where helpers fall
behind often, products run on the caller alone for a while (`ProductPool`). OpenBLAS's own threads
split every product into fixed halves and wait for both: on a busy machine that made steps 5-7x slower
(docs/benchmarks.md, `bench smollm2`), and OpenBLAS's thread count is the whole process's, small models included.

Each chunk or share is the same BLAS call on the same rows as in one thread (edges fall on 256-row blocks or
whole panels), so every thread count gives the same floats.

    set_threads(2)                   # the process's pool for layout weights' products (1: no helpers)

How many threads: engine/model/thread_choice.py (`--threads`, else measured when such a model loads).
"""
from __future__ import annotations

import _thread
import itertools
import logging
import threading
import time
from contextlib import contextmanager

import numpy as np

from .product_processes import MAX_ROWS, X_FLOATS, ProductProcesses, part

logger = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20          # of weights per chunk (~0.2 ms of streaming): 1 MB chunks streamed slower


class ProductPool:
    """`threads - 1` helpers that share a product with the calling thread: helper processes for few rows
    (`few_rows`, `processes`), helper threads for chunks (`run`, `chunked`).

    `run(tasks)` calls every callable in `tasks` once and returns their results in order; the caller runs
    chunks too. When the caller has taken the last chunk it waits for the helpers' unfinished chunks until
    PATIENCE times its own time per chunk has passed since the last of them began, then computes them itself:
    a helper that lost its core in mid-chunk (another process, the browser) costs a few chunks' time, not the
    scheduler's time slice. Its late result is dropped.

    Whether sharing pays is decided as it runs. A product in helper processes (`few_rows`) is shared while they
    keep up (`ProductProcesses.keeping_up`: a helper that loses its core makes the caller wait, and the products
    then run alone for a while). Per-shape averages of both ways misled there: noise pushed a shape's shared
    average up, and the step ran 7-8% slower than with every product shared (docs/benchmarks.md, `bench
    smollm2`). A product in chunks on helper threads (`product`) runs the way measured faster for its shape (the
    weight's and the rows): an average of the wall time shared and one of the caller alone in one call, and one
    run in EXPLORE the other way, so that both averages follow the machine. On a machine whose other core is
    busy, a helper thread preempted while it holds the GIL stalls the caller for a time slice, which no chunk's
    lateness shows: the averages do, and the products then run on the caller alone.
    One caller at a time (the engine thread); a second caller waits.
    """

    PATIENCE = 3.0                # a helper's chunk may take this many of the caller's chunk times
    MIN_PATIENCE_S = 50e-6
    EXPLORE = 16                  # one product of a shape in this many runs the way its averages do not prefer
    AVERAGING = 0.1               # weight of the newest run in a shape's averages

    def __init__(self, threads: int = 1):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.late = 0                # take-overs so far (a figure for benchmarks)
        self.timings: dict = {}      # product shape -> [runs, mean s alone, mean s shared]
        self.share: bool | None = None   # None: as measured; True / False: always / never (tests, experiments)
        self._job = None
        self._closed = False
        self._caller = threading.Lock()
        self.use_processes = threads > 1      # helper processes for few-row products (False: threads only)
        self._processes: ProductProcesses | None = None
        self._wakes = [_thread.allocate_lock() for _ in range(threads - 1)]
        for wake in self._wakes:
            wake.acquire()
        self._helpers = [threading.Thread(target=self._helper, args=(wake,), name=f"products-{i + 1}", daemon=True)
                         for i, wake in enumerate(self._wakes)]
        for h in self._helpers:
            h.start()

    def _helper(self, wake) -> None:
        while True:
            wake.acquire()
            if self._closed:
                return
            job = self._job
            if job is not None:
                _drain(job)

    def run(self, tasks: list) -> list:
        """Every task once, shared with the helpers; their results in order."""
        if not self._wakes or len(tasks) < 2:
            return [task() for task in tasks]
        return self._shared(tasks)

    def product(self, whole, shared, shape):
        """A product the faster way for its `shape` (a hashable: the weight's shape and the rows): `whole()` in
        one call on the caller alone, or `shared()` (`chunked`). Both give the same floats."""
        if not self._wakes or self.share is False:
            return whole()
        if self.share:
            return shared()
        timing = self.timings.setdefault(shape, [0, None, None])
        sharing = share_next(timing, self.EXPLORE)
        t = time.perf_counter()
        out = shared() if sharing else whole()
        seconds, i = time.perf_counter() - t, 2 if sharing else 1
        timing[i] = seconds if timing[i] is None else timing[i] + self.AVERAGING * (seconds - timing[i])
        return out

    def chunked(self, chunks, assemble):
        """The shared way of a product cut into chunks: `assemble(run(chunks()))`."""
        return lambda: assemble(self.run(chunks()))

    def few_rows(self, w, x, out) -> bool:
        """x [n, C] times a stored weight `w` (panels or [out, in]) into `out` where helper processes take it (few
        rows: engine/model/product_processes.py): shared while they keep up, else on the caller alone, the same
        floats either way. False where they cannot take it: the caller then goes through `product`."""
        if self.share is False or x.shape[0] > MAX_ROWS or x.dtype != np.float32:
            return False
        far = self.processes()
        entry = far.weight(w) if far is not None else None
        if entry is None or x.shape[0] > entry.max_rows or x.size > X_FLOATS:
            return False
        if not (self.share or far.keeping_up()):
            part(w, x, out)
            return True
        before = far.cpu_beyond
        far.rows(entry, np.ascontiguousarray(x), out)
        _beyond.seconds = getattr(_beyond, "seconds", 0.0) + far.cpu_beyond - before
        return True

    def processes(self) -> ProductProcesses | None:
        """The pool's helper processes (started on first use), or None: turned off (`use_processes`), dead, or
        not able to run here."""
        if not self.use_processes:
            return None
        if self._processes is None:
            try:
                self._processes = ProductProcesses(self.threads - 1)
            except (OSError, RuntimeError) as e:   # no shared memory or no processes here: threads only
                logger.warning("helper processes unavailable, products shared on threads: %s", e)
                self.use_processes = False
                return None
        return self._processes if self._processes.alive else None

    def _shared(self, tasks: list) -> list:
        with self._caller:
            n = len(tasks)
            done = _thread.allocate_lock()
            done.acquire()
            job = self._job = [tasks, itertools.count(), itertools.count(1), done, [None] * n, [0.0] * n, [0.0] * n]
            for wake in self._wakes:
                if wake.locked():
                    wake.release()
            t, cpu = time.perf_counter(), time.thread_time()
            try:
                mine = _drain(job, caller=True)
                if next(job[2]) <= n:        # a helper is still in a chunk: it releases `done` at the last one
                    per_chunk = (time.perf_counter() - t) / max(mine, 1)
                    deadline = max(job[5]) + max(self.MIN_PATIENCE_S, self.PATIENCE * per_chunk)
                    if not done.acquire(timeout=max(0.0, deadline - time.perf_counter())):
                        self.late += 1
                # the helpers' CPU time beyond the caller's: what the product took on top of the caller's part
                helpers = sum(job[6]) / len(self._wakes) - (time.thread_time() - cpu)
                _beyond.seconds = getattr(_beyond, "seconds", 0.0) + max(0.0, helpers)
            finally:
                self._job = None
            results = job[4]
            for i, r in enumerate(results):  # a late helper's chunks (or one that raised): computed here
                if r is None:
                    results[i] = tasks[i]()
            return results

    def close(self) -> None:
        self._closed = True
        if self._processes is not None:
            self._processes.close()
        for wake in self._wakes:
            if wake.locked():
                wake.release()


def share_next(timing: list, explore: int) -> bool:
    """Whether a product of one shape runs shared next: [runs so far, mean s alone, mean s shared] (updated:
    the run is counted). The first run goes alone and the second shared, so both means exist; then the
    faster way, and every `explore`-th run the other."""
    timing[0] += 1
    runs, alone, shared = timing
    if alone is None or shared is None:
        return alone is not None
    faster = shared < alone
    return faster != (runs % explore == 0)


def _drain(job, caller: bool = False) -> int:
    """Take chunks of `job` until none is left, storing their results; returns how many this thread ran.
    `next()` of an itertools.count is atomic under the GIL: every chunk is taken once and every finish counted
    once. The caller counts one more finish of its own after draining (`ProductPool.run`), so whoever counts
    n + 1 is last: a helper that is releases `done`."""
    tasks, taken, finished, done, results, started, helper_cpu = job
    n, ran = len(tasks), 0
    while (i := next(taken)) < n:
        started[i] = time.perf_counter()
        cpu = time.thread_time()
        try:
            results[i] = tasks[i]()
        except Exception:             # noqa: BLE001  (a helper's: left unset, the caller runs it again and raises)
            if caller:
                raise
        if not caller:
            helper_cpu[i] = time.thread_time() - cpu
        ran += 1
        if next(finished) == n + 1:
            done.release()
    return ran


_beyond = threading.local()      # per calling thread: helpers' CPU seconds beyond its own, summed (`shared_clock`)


def shared_clock() -> float:
    """The calling thread's CPU time plus, for each product it shared, the helpers' CPU time on their chunks
    beyond its own: a shared product takes as long as its busiest thread, and CPU time leaves out every thread's
    waits (for the GIL, for a core). What engine time is measured on for a model whose products are shared
    (engine/kv/runner.py's `clock_for`)."""
    return time.thread_time() + getattr(_beyond, "seconds", 0.0)


_POOLS = {1: ProductPool(1)}      # one pool per thread count used so far: idle helper threads block and cost nothing
_POOL = _POOLS[1]


def set_threads(threads: int) -> ProductPool:
    """The process's pool for the products of layout weights: `threads` threads in all (the caller included)."""
    global _POOL
    if threads not in _POOLS:
        _POOLS[threads] = ProductPool(threads)
    _POOL = _POOLS[threads]
    return _POOL


def stop_other_processes() -> None:
    """End the helper processes of every pool but the process's current one: each holds a share of the weights
    (a measurement of several thread counts starts them all); a pool used again starts its own anew."""
    for pool in _POOLS.values():
        if pool is not _POOL and pool._processes is not None:
            pool._processes.close()
            pool._processes = None


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
    per = max(1, CHUNK_BYTES // max(row_bytes, 1))
    if parts:
        per = min(per, -(-size // parts))
    per = max(align, -(-per // align) * align)
    return list(range(0, size, per)) + [size]


def vec_product(x, w):  # [C] @ a layout weight -> [D], chunks on the pool (one thread: the layout's own)
    pool = _POOL
    if pool.threads == 1:
        return w.vec(x)
    return w.vec(x, pool)


def rows_product(x, w):  # [n, C] @ a layout weight -> [n, D], chunks on the pool
    pool = _POOL
    if pool.threads == 1:
        return w.rows(x)
    return w.rows(x, pool)


def read_chunked(arrays, pool: ProductPool) -> None:
    """One pass over `arrays` (1-D), a BLAS dot of each chunk with itself, on the pool: the floor of a step."""
    tasks = []
    for v in arrays:
        edges = chunk_edges(len(v), v.itemsize, 1024, pool.threads)
        tasks += [lambda c=v[a:b]: np.dot(c, c) for a, b in zip(edges, edges[1:])]
    pool.run(tasks)
