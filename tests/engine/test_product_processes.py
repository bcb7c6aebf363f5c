"""Shares of few-row weight products in helper processes (engine/model/product_processes.py): one thread's floats,
a stopped or killed helper taken over without a hang or a changed float, and helpers that end with their process.

No test here depends on how fast the machine is: a helper either answers because the caller waits for it
(`patience` infinite), or cannot answer because it is stopped or killed on purpose."""
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.model import product_processes as P
from engine.model.layout import LAYOUTS

WAIT_S = 20.0      # the most a test waits for a process to start, run again or end (a liveness bound only)


def stored(layout: str, c: int, d: int, seed: int = 0):
    """A [C, D] weight in `layout`, as a model stores it: its stored array (panels or [out, in])."""
    return LAYOUTS[layout](np.random.default_rng(seed).standard_normal((c, d)).astype(np.float32)).data


def one_thread(data, x):
    out = np.empty((data.shape[0], x.shape[0], data.shape[2]) if data.ndim == 3 else (x.shape[0], data.shape[0]),
                   np.float32)
    P.part(data, x, out)
    return out


def product(far, data, x):
    out = np.full_like(one_thread(data, x), np.nan)
    far.rows(far.weight(data), x, out)
    return out


@pytest.fixture(scope="module")
def far():
    processes = P.ProductProcesses(2, patience=math.inf)      # the caller always waits for the helpers' shares
    yield processes
    processes.close()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_shares_computed_in_helper_processes_are_one_threads_floats(far, layout):
    """Three shares (the caller's and two helpers'), every row count a product of few rows has: bit for bit, and
    every helper share computed by its helper."""
    rng = np.random.default_rng(1)
    parts, taken_over = far.parts, far.taken_over
    for c, d in ((576, 960), (128, 1536)):
        data = stored(layout, c, d)
        entry = far.weight(data)
        assert entry is not None and len(entry.edges) == 4 and entry.edges[0] == 0 and entry.edges[-1] == len(data)
        for n in range(1, P.MAX_ROWS + 1):
            x = rng.standard_normal((n, c)).astype(np.float32)
            assert np.array_equal(product(far, data, x), one_thread(data, x))
    assert far.parts - parts == 2 * 2 * P.MAX_ROWS and far.taken_over == taken_over


def test_a_weight_too_small_to_share_or_not_float32_is_not_taken(far):
    assert far.weight(stored("out_in", 64, 256)) is None                  # one 256-row block, three shares
    assert far.weight(stored("panels", 64, 128).astype(np.float64)) is None


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_stopped_helper_is_taken_over_gets_no_post_till_it_answers_and_its_late_answer_is_never_used(layout):
    """A helper stopped (as one whose core is taken for long): the caller computes its share after PATIENCE, then
    posts nothing to it, so later products wait for nothing; once it runs again it answers the part it was late
    for, and only the next post's answer is used. The same floats throughout."""
    far = P.ProductProcesses(1, patience=math.inf)
    data = stored(layout, 256, 2048)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 256)).astype(np.float32) for _ in range(4)]
    try:
        assert np.array_equal(product(far, data, xs[0]), one_thread(data, xs[0]))      # sent, and answered
        pid = far.helpers[0].process.pid
        stop(pid)
        far.patience = P.PATIENCE
        try:
            parts, taken_over = far.parts, far.taken_over
            for x in xs:
                assert np.array_equal(product(far, data, x), one_thread(data, x))
            assert far.parts == parts + 1 and far.taken_over == taken_over + 1            # one post, late
        finally:
            os.kill(pid, signal.SIGCONT)
        far.patience = math.inf                      # from now on its answers are waited for
        deadline = time.monotonic() + WAIT_S
        while far.parts == parts + 1 and time.monotonic() < deadline:                      # till it answers
            assert np.array_equal(product(far, data, xs[1]), one_thread(data, xs[1]))
        assert far.parts == parts + 2, "the helper got no post after it ran again"
        assert far.taken_over == taken_over + 1 and not far.helpers[0].gone
    finally:
        far.close()


def test_a_late_helper_sits_out_rest_products_and_twice_as_many_when_late_again_soon():
    """A helper late once (stopped on purpose, then let run and answer) gets no post for REST products; late again
    within REST posts of that, for 2 * REST; after REST posts on time, for REST again. Counted in posts."""
    far = P.ProductProcesses(1, patience=math.inf)
    data = stored("panels", 256, 2048)
    x = np.random.default_rng(4).standard_normal((2, 256)).astype(np.float32)
    expected, helper = one_thread(data, x), far.helpers[0]

    def late_then_sits_out(products: int):
        stop(helper.process.pid)
        far.patience = P.PATIENCE
        try:
            assert np.array_equal(product(far, data, x), expected)               # late: taken over
        finally:
            os.kill(helper.process.pid, signal.SIGCONT)
        far.patience = math.inf
        assert helper.wait(time.perf_counter() + WAIT_S, sleep=True)             # it answers the late part
        parts = far.parts
        for _ in range(products):
            assert np.array_equal(product(far, data, x), expected)
        assert far.parts == parts, "posted to a resting helper"
        assert np.array_equal(product(far, data, x), expected) and far.parts == parts + 1

    try:
        assert np.array_equal(product(far, data, x), expected)
        late_then_sits_out(P.REST)
        late_then_sits_out(2 * P.REST)                  # late again on its first post after the rest
        for _ in range(P.REST):                         # REST posts on time
            assert np.array_equal(product(far, data, x), expected)
        late_then_sits_out(P.REST)
        assert far.taken_over == 3
    finally:
        far.close()


def test_a_helper_that_dies_is_taken_over_and_given_up():
    """A helper killed: the caller computes its share (the same floats), and from then on every product runs
    without it, posted to no one."""
    far = P.ProductProcesses(1, patience=math.inf)
    data = stored("panels", 256, 2048)
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    expected = one_thread(data, x)
    try:
        assert np.array_equal(product(far, data, x), expected)
        helper = far.helpers[0].process
        os.kill(helper.pid, signal.SIGKILL)
        helper.join(WAIT_S)
        assert not helper.is_alive()
        parts = far.parts
        for _ in range(3):
            assert np.array_equal(product(far, data, x), expected)
        assert far.parts == parts + 1 and far.taken_over == 1 and far.helpers[0].gone
    finally:
        far.close()


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


def stop(pid: int) -> None:
    """SIGSTOP `pid` and wait till it is stopped (the signal lands asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + WAIT_S
    while state(pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert state(pid) == "T"


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def running(pid: int) -> bool:
    """Whether `pid` is a live process (an exited one that no one has reaped yet is not)."""
    return state(pid) not in (None, "Z")
