"""Shares of few-row weight products in helper processes (engine/model/product_processes.py): the same floats as
one thread, a helper that dies taken over, and helpers that end with their process."""
import itertools
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.model import product_processes as P
from engine.model import threads as T
from engine.model.layout import LAYOUTS

WAIT_S = 20.0      # the most a test waits for a process to start or end (a helper checks its parent every second)


def stored(layout: str, c: int, d: int, seed: int = 0):
    """A [C, D] weight in `layout`, as a model stores it, and its stored array (panels or [out, in])."""
    w = LAYOUTS[layout](np.random.default_rng(seed).standard_normal((c, d)).astype(np.float32))
    return w, w.data


def one_thread(data, x):
    out = np.empty((data.shape[0], x.shape[0], data.shape[2]) if data.ndim == 3 else (x.shape[0], data.shape[0]),
                   np.float32)
    P.part(data, x, out)
    return out


@pytest.fixture(scope="module")
def far():
    processes = P.ProductProcesses(2)
    yield processes
    processes.close()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_shares_computed_in_helper_processes_are_one_threads_floats(far, layout):
    """Three shares (the caller's and two helpers'), every row count a product of few rows has: bit for bit."""
    rng = np.random.default_rng(1)
    for c, d in ((576, 960), (128, 1536)):
        _, data = stored(layout, c, d)
        entry = far.weight(data)
        assert entry is not None and len(entry.edges) == 4
        for n in range(1, P.MAX_ROWS + 1):
            x = rng.standard_normal((n, c)).astype(np.float32)
            out = np.full_like(one_thread(data, x), np.nan)
            assert np.array_equal(far.rows(entry, x, out), one_thread(data, x))
    assert far.alive


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_callers_share_moves_inside_the_first_helpers_and_the_floats_stay(layout):
    """Where the caller's share ends moves a unit a product, never out of helper 1's share (helper 1 keeps at
    least a unit), and every product on the way gives one thread's floats."""
    far = P.ProductProcesses(1)
    try:
        _, data = stored(layout, 256, 4096)
        entry = far.weight(data)
        unit = 1 if data.ndim == 3 else P.BLOCK_ROWS
        x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
        expected, ends = one_thread(data, x), set()
        for _ in range(40):
            out = np.full_like(expected, np.nan)
            assert np.array_equal(far.rows(entry, x, out), expected)
            ends.add(far._mids[(data.shape, 2)])
        assert all(entry.edges[1] <= e <= entry.edges[2] - unit and (e - entry.edges[1]) % unit == 0 for e in ends)
    finally:
        far.close()


def test_a_helper_never_acts_on_a_post_mixed_of_two():
    """A helper late for a part may read the control block while the next post (a new weight) is written: in
    every interleaving of the writer's stores with the reader's loads, the reader gets the old post, the new one,
    or nothing (and the new post's release wakes it again)."""
    old, new = (5, P.PRODUCT, 1, 3, 2), (6, P.ATTACH, 2, 0, 0)
    writes = []
    P.write_post(Recorder(writes), *new)
    readings = set()
    for before in itertools.combinations_with_replacement(range(len(writes) + 1), 6):   # writes done by read i
        ctrl = np.zeros(16, np.int64)
        P.write_post(ctrl, *old)
        readings.add(P.read_post(Interleaved(ctrl, writes, before)))
    assert readings <= {old, new, None} and {old, new, None} <= readings


class Recorder:
    def __init__(self, writes):
        self.writes = writes

    def __setitem__(self, i, v):
        self.writes.append((i, v))


class Interleaved:
    """A control block whose writer's stores land between the reader's loads: before the i-th load,
    `before[i]` of them have landed."""
    def __init__(self, ctrl, writes, before):
        self.ctrl, self.writes, self.before, self.done, self.loads = ctrl, writes, before, 0, 0

    def __getitem__(self, i):
        while self.done < self.before[self.loads]:
            self.ctrl.__setitem__(*self.writes[self.done])
            self.done += 1
        self.loads += 1
        return self.ctrl[i]


def test_a_helpers_shares_are_carved_in_order_from_large_allocations():
    """Small shares share one allocation (huge pages: numpy madvises from 4 MB), each on a 64-byte line; one that
    does not fit starts the next allocation; one as large as an allocation gets its own."""
    arena = P.Arena(floats=1000)
    a, b = arena.take((3, 7)), arena.take((10, 10))
    assert a.base is b.base and b.ctypes.data - a.ctypes.data == 32 * 4 and b.ctypes.data % 64 == a.ctypes.data % 64
    c = arena.take((900,))
    assert c.base is not a.base and c.shape == (900,)
    d = arena.take((1000,))
    assert d.base is None and d.shape == (1000,)


def test_a_weight_too_small_to_share_or_not_float32_is_not_taken(far):
    assert far.weight(stored("out_in", 64, 256)[1]) is None                  # one 256-row block, three parts
    assert far.weight(stored("panels", 64, 128)[1].astype(np.float64)) is None


def test_a_helper_that_dies_is_taken_over_and_products_go_back_to_threads():
    """A helper killed mid-run: the caller computes its share (same floats), notices the death, and the pool's
    later products are shared on threads."""
    pool = T.ProductPool(2)
    pool.share = True
    w, data = stored("panels", 256, 2048)
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    expected = w.rows(x)                                                      # one thread
    try:
        assert np.array_equal(w.rows(x, pool), expected)
        far = pool.processes()
        assert far is not None
        late = far.late                      # a first share can be late (a helper's first touch of its buffers)
        helper = far.helpers[0].process
        os.kill(helper.pid, signal.SIGKILL)
        helper.join(WAIT_S)
        assert not helper.is_alive()
        assert np.array_equal(w.rows(x, pool), expected)
        assert far.late == late + 1 and not far.alive and pool.processes() is None
        assert np.array_equal(w.rows(x, pool), expected)                       # on the threads now
    finally:
        pool.close()


def test_products_run_alone_while_the_helper_has_no_core_and_shared_again_after_it_has():
    """A stopped helper (as one whose core is taken) makes the caller take its share over: the products then run
    on the caller alone for REST products, none posted to the helper, and are shared again once it runs."""
    pool = T.ProductPool(2)                          # share None: as decided at run time
    w, data = stored("panels", 256, 2048)
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    expected = w.rows(x)
    try:
        assert np.array_equal(w.rows(x, pool), expected)
        far = pool.processes()
        posted = far.products
        os.kill(far.helpers[0].process.pid, signal.SIGSTOP)
        try:
            for _ in range(P.REST):
                assert np.array_equal(w.rows(x, pool), expected)
            assert far.late > 0 and far.resting > 0
            slow = far.products - posted              # shared until the caller rests its helper
            assert slow < P.REST // 2
        finally:
            os.kill(far.helpers[0].process.pid, signal.SIGCONT)
        for _ in range(P.REST):
            assert np.array_equal(w.rows(x, pool), expected)
        assert far.products > posted + slow            # shared again
        assert far.alive
    finally:
        pool.close()


def test_a_helper_that_falls_behind_again_soon_after_a_rest_rests_twice_as_long():
    """A core taken for seconds (a browser beside the server): each rest that ends with the helper still behind is
    followed by one twice as long, up to MAX_REST; after a pause in which the helpers slept, or once sharing has
    kept up for RECENT products, REST again."""
    pool = T.ProductPool(2)
    w, _ = stored("panels", 256, 2048)
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    expected = w.rows(x)

    def until(done, most):
        for _ in range(most):
            if done():
                return True
            assert np.array_equal(w.rows(x, pool), expected)
        return done()

    try:
        assert np.array_equal(w.rows(x, pool), expected)
        far = pool.processes()
        pid = far.helpers[0].process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            rests = []
            for _ in range(3):
                assert until(lambda: far.resting > 0, P.REST)                # fell behind: a rest starts
                rests.append(far.rest)
                assert until(lambda: far.resting == 0, far.rest)            # it ends, the helper still stopped
            assert rests == [P.REST, 2 * P.REST, 4 * P.REST]
            assert np.array_equal(w.rows(x, pool), expected)
            time.sleep(2 * P.SPIN_S)                   # the helpers would sleep: their next parts are slow anyway
            assert until(lambda: far.resting > 0, P.REST) and far.rest == P.REST
        finally:
            os.kill(pid, signal.SIGCONT)
        assert until(lambda: far.resting == 0 and far.shared >= P.RECENT, 4 * P.REST + 4 * P.RECENT)  # kept up
        os.kill(pid, signal.SIGSTOP)
        try:
            assert until(lambda: far.resting > 0, P.REST)
            assert far.rest == P.REST
        finally:
            os.kill(pid, signal.SIGCONT)
        assert far.alive
    finally:
        pool.close()


def test_helpers_end_when_the_process_that_started_them_is_killed(tmp_path):
    """A server killed with SIGKILL runs no clean-up: its helpers notice that their parent is gone and exit."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal, sys\n"
        "import engine\n"
        "from engine.model.product_processes import ProductProcesses\n"
        "if __name__ == '__main__':\n"
        "    far = ProductProcesses(2)\n"
        "    print(' '.join(str(h.process.pid) for h in far.helpers), flush=True)\n"
        "    sys.stdin.readline()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(running(p) for p in pids)
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.wait(WAIT_S) == -signal.SIGKILL
        deadline = time.monotonic() + WAIT_S
        while any(running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(running(p) for p in pids), "a helper outlived its parent"
    finally:
        parent.kill()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (an exited one that no one has reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pools_not_in_use_end_their_helper_processes_and_start_them_anew_when_used():
    """A measurement over 1 .. N threads starts every pool's helpers; once one count is chosen the others end (they
    hold shares of the weights), and a pool used again starts new ones."""
    before = T.threads()
    w, data = stored("panels", 256, 2048)
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    expected = w.rows(x)
    pool = T.set_threads(2)
    pool.share, pool.use_processes = True, True
    try:
        assert np.array_equal(T.rows_product(x, w), expected)
        helper = pool.processes().helpers[0].process
        T.set_threads(1)
        T.stop_other_processes()
        helper.join(WAIT_S)
        assert not helper.is_alive() and pool._processes is None
        T.set_threads(2)
        assert np.array_equal(T.rows_product(x, w), expected)
        assert pool.processes() is not None and pool.processes().products >= 1
    finally:
        pool.share = None
        T.set_threads(before)
