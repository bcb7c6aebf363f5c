"""Weight products on several threads (engine/model/threads.py): every chunk once, the same floats at every
thread count (helper processes answering, stopped, or not used), and the thread choice's rule.

No test here depends on how fast the machine is: helper processes are waited for (`patience` infinite) or stopped
on purpose, and helper threads are held on events."""
import math
import os
import signal
import threading

import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.model import thread_choice as C
from engine.model import threads as T
from engine.model.layout import FEW_ROWS, LAYOUTS, PanelWeight, use_layout
from engine.model.llama import forward
from engine.model.product_processes import PATIENCE

WAIT_S = 10.0      # the most a test waits for a helper thread to be scheduled (a liveness bound only)


@pytest.fixture
def restore_threads():
    before = T.threads()
    yield
    for threads in (2, 3):
        pool = T.set_threads(threads)
        pool.use_processes = True
        if pool.processes() is not None:
            pool.processes().patience = PATIENCE
    T.set_threads(before)


def sharing(threads: int, processes: bool = True) -> T.ProductPool:
    """The process's pool of `threads`: few-row products in helper processes whose every share is waited for
    (so each is computed by its helper), or (`processes=False`) all in chunks on the thread pool."""
    pool = T.set_threads(threads)
    pool.use_processes = processes and threads > 1
    if pool.processes() is not None:
        pool.processes().patience = math.inf
    return pool


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_task_runs_once_and_results_keep_their_order(threads):
    pool = T.ProductPool(threads)
    try:
        for k in (1, 2, 3, 17, 200):
            runs = []
            results = pool.run([lambda i=i: runs.append(i) or i * i for i in range(k)])
            assert results == [i * i for i in range(k)]
            assert sorted(runs) == list(range(k))
    finally:
        pool.close()


def test_helpers_take_chunks():
    """The caller's chunk waits until a helper thread has run one: the pool's helpers do share the work."""
    pool = T.ProductPool(2)
    helper_ran = threading.Event()
    caller = threading.get_ident()

    def task(i):
        if threading.get_ident() == caller:
            assert helper_ran.wait(WAIT_S), "no helper thread ran a chunk"
        else:
            helper_ran.set()
        return i, threading.get_ident() == caller
    try:
        results = pool.run([lambda i=i: task(i) for i in range(8)])
    finally:
        pool.close()
    assert [i for i, _ in results] == list(range(8))
    assert not all(by_caller for _, by_caller in results)


def test_the_caller_runs_every_chunk_a_stalled_helper_has_not_begun():
    """A helper thread held in its chunk (as a preempted thread is held by the scheduler): the caller runs every
    other chunk itself, and waits only for the held one."""
    pool = T.ProductPool(2)
    caller, release = threading.get_ident(), threading.Event()
    ran_by = {}

    def task(i):
        ran_by[i] = threading.get_ident() == caller
        if not ran_by[i]:
            assert release.wait(WAIT_S), "the caller did not run the other chunks"
        elif sum(ran_by.values()) == 5:          # every chunk but one: the held one, or its own last
            release.set()
        return i
    try:
        assert pool.run([lambda i=i: task(i) for i in range(6)]) == list(range(6))
    finally:
        release.set()
        pool.close()
    assert sum(not by_caller for by_caller in ran_by.values()) <= 1


def test_an_error_in_a_chunk_reaches_the_caller():
    pool = T.ProductPool(2)

    def boom():
        raise ZeroDivisionError("chunk")
    try:
        for tasks in ([lambda: 1, boom, lambda: 3, lambda: 4], [boom, lambda: 2], [lambda: 1, boom]):
            with pytest.raises(ZeroDivisionError):
                pool.run(tasks)
        assert pool.run([lambda: 1, lambda: 2]) == [1, 2]
    finally:
        pool.close()


@pytest.mark.parametrize("padded", [{1: 2}, {2: 4}], ids=["one row as two", "one row as a GEMV"])
@pytest.mark.parametrize("processes", [True, False], ids=["helper processes", "threads only"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_products_are_the_same_floats_at_every_thread_count(layout, processes, padded, restore_threads, monkeypatch):
    """Every row count's call pattern (one row, a few, many; panels' rows padded or not), shared on 1, 2 and 3
    threads: bit for bit."""
    monkeypatch.setattr(PanelWeight, "padded_rows", padded)
    monkeypatch.setattr(PanelWeight, "row_by_row", frozenset())
    rng = np.random.default_rng(0)
    for c, d in ((576, 960), (128, 704)):
        lw = LAYOUTS[layout](rng.standard_normal((c, d)).astype(np.float32))
        x = rng.standard_normal((24, c)).astype(np.float32)
        T.set_threads(1)
        one = [T.vec_product(x[0], lw)] + [T.rows_product(x[:n], lw) for n in (1, 2, 3, 5, FEW_ROWS, 24)]
        for threads in (2, 3):
            far = sharing(threads, processes).processes()
            before = (far.parts, far.taken_over) if far else None
            many = [T.vec_product(x[0], lw)] + [T.rows_product(x[:n], lw) for n in (1, 2, 3, 5, FEW_ROWS, 24)]
            if processes:                    # every product of few rows, each helper's share by its helper
                assert (far.parts - before[0], far.taken_over) == (6 * (threads - 1), before[1])
            else:
                assert far is None
            for a, b in zip(one, many):
                assert np.array_equal(a, b)


def test_row_by_row_products_are_the_same_floats_at_every_thread_count(restore_threads, monkeypatch):
    """Panel products of a few rows run row by row (`PanelWeight.row_by_row`) on 1, 2 and 3 threads: bit for bit,
    and on the thread pool even where helper processes run (they take padded GEMMs only)."""
    monkeypatch.setattr(PanelWeight, "row_by_row", frozenset({2, 3, 5}))
    rng = np.random.default_rng(0)
    lw = PanelWeight(rng.standard_normal((576, 960)).astype(np.float32))
    x = rng.standard_normal((5, 576)).astype(np.float32)
    T.set_threads(1)
    one = [T.rows_product(x[:n], lw) for n in (2, 3, 5)]
    for threads in (2, 3):
        far = sharing(threads).processes()
        before = far.parts if far else 0
        for a, n in zip(one, (2, 3, 5)):
            assert np.array_equal(a, T.rows_product(x[:n], lw))
        assert (far.parts if far else 0) == before


@pytest.mark.parametrize("processes", [True, False], ids=["helper processes", "threads only"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_greedy_decoding_is_identical_at_every_thread_count(make_model, layout, processes, restore_threads):
    """Prefill, decode steps and a 5-row verification of a model in a layout: the same logits on 1, 2 and 3
    threads, so the same greedy tokens."""
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    model = use_layout(type(plain)(plain.cfg, weights), layout)
    prompt = np.random.default_rng(6).integers(0, plain.cfg.vocab_size, 20)
    runs = {}
    for threads in (1, 2, 3):
        sharing(threads, processes)
        mgr = KVCacheManager(model.cfg, num_blocks=8, block_size=8)
        seq = mgr.new_sequence()
        tokens = list(prompt)
        logits = [forward(model, prompt, 0, mgr.append_slots(seq, prompt))]
        for _ in range(12):
            tokens.append(int(logits[-1][-1].argmax()))
            logits.append(forward(model, tokens[-1:], len(tokens) - 1, mgr.append_slots(seq, tokens[-1:])))
        check = np.array(tokens[-5:])
        logits.append(forward(model, check, len(tokens), mgr.append_slots(seq, check)))
        runs[threads] = (tokens, logits)
    for threads in (2, 3):
        assert runs[threads][0] == runs[1][0]
        assert all(np.array_equal(a, b) for a, b in zip(runs[threads][1], runs[1][1]))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_stopped_helper_process_changes_no_logit_and_holds_no_step(make_model, layout, restore_threads):
    """A helper process stopped in mid-run (its core taken for long): the steps finish, the caller computing the
    helper's shares, and every logit is one thread's."""
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    model = use_layout(type(plain)(plain.cfg, weights), layout)
    prompt = np.random.default_rng(6).integers(0, plain.cfg.vocab_size, 20)
    runs = {}
    for threads in (1, 2):
        far = sharing(threads).processes()
        mgr = KVCacheManager(model.cfg, num_blocks=8, block_size=8)
        seq = mgr.new_sequence()
        logits = [forward(model, prompt, 0, mgr.append_slots(seq, prompt))]
        for i in range(8):
            if far is not None and i == 2:
                far.patience = PATIENCE
                os.kill(far.helpers[0].process.pid, signal.SIGSTOP)
            token = [int(logits[-1][-1].argmax())]
            logits.append(forward(model, token, len(prompt) + i, mgr.append_slots(seq, token)))
        if far is not None:
            os.kill(far.helpers[0].process.pid, signal.SIGCONT)
            assert far.taken_over >= 1
        runs[threads] = logits
    assert all(np.array_equal(a, b) for a, b in zip(runs[2], runs[1]))


def test_the_choice_is_the_rule_or_the_request_and_says_why():
    assert [C.choose(None, c).threads for c in (1, 2, 3, 4, 8, 64)] == [1, 2, 3, 3, 7, C.MAX_THREADS]
    assert [C.choose(None, c, serving=True).threads for c in (1, 2, 3, 4)] == [1, 1, 2, 3]
    assert C.choose(None, 1).reason == "one core available"
    assert C.choose(None, 2).reason == "2 cores, every one" and C.choose(None, 8).reason == "8 cores, one left free"
    assert C.choose(None, 64).reason == f"64 cores, at most {C.MAX_THREADS}"
    assert "a server leaves one" in C.choose(None, 2, serving=True).reason
    asked = C.choose(3, 2, serving=True)
    assert asked.threads == 3 and asked.reason.startswith("--threads 3 (the default here would be 1: 2 cores, a server")


def test_the_choice_is_applied_when_a_model_loads_and_a_request_applies_at_once(make_model, restore_threads,
                                                                                  monkeypatch):
    """`threads_for` sets the process's pool and times one pass over the weights at that count (the floor a page
    shows); `request_threads` afterwards switches the pool at once."""
    for name in ("_choice", "_requested", "_serving"):
        monkeypatch.setattr(C, name, getattr(C, name))
    monkeypatch.setattr(C, "_choice", None)
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    model = use_layout(type(plain)(plain.cfg, weights), "out_in")
    C.request_threads(2)
    choice = C.threads_for(model)
    assert choice is C.current_choice() and (choice.threads, T.threads()) == (2, 2)
    assert set(choice.read_ms) == {2} and choice.read_ms[2] > 0 and "--threads 2" in choice.reason
    C.request_threads(1)
    assert (C.current_choice().threads, T.threads()) == (1, 1)


@pytest.mark.parametrize("bad", [0, -1, 257])
def test_a_thread_count_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="threads"):
        C.request_threads(bad)


def test_eagle_demo_settings_follow_the_thread_count(tmp_path, restore_threads):
    """bench heads stores EAGLE's best γ and threshold per thread count; a request that leaves them out on SmolLM2
    (the page's demo, a link, /api/ws) gets the entry of the server's count (the most threads measured up to it)."""
    import json
    from types import SimpleNamespace

    from engine.serving.request_fit import model_defaults
    from engine.spec_decode.heads import demo_settings

    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    assert demo_settings("smollm2-135m", 2, tmp_path) is None
    (folder / "demo.json").write_text(json.dumps({"by_threads": {
        "1": {"num_speculative_tokens": 5, "draft_confidence_threshold": 0.5},
        "2": {"num_speculative_tokens": 7, "draft_confidence_threshold": 0.3}}}))
    assert demo_settings("smollm2-135m", 1, tmp_path)["num_speculative_tokens"] == 5
    assert demo_settings("smollm2-135m", 2, tmp_path)["draft_confidence_threshold"] == 0.3
    assert demo_settings("smollm2-135m", 4, tmp_path)["threads"] == 2
    lm = SimpleNamespace(name="smollm2-135m", meta={"heads": ["eagle"]})
    registry = SimpleNamespace(heads_dir=tmp_path, draft_for=lambda target: None)
    for threads, gamma, q in ((1, 5, 0.5), (2, 7, 0.3)):
        T.set_threads(threads)
        d = model_defaults(registry, lm)
        assert (d["method"], d["num_speculative_tokens"], d["draft_confidence_threshold"]) == ("eagle", gamma, q)
