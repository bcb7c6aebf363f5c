"""Weight products on several threads (engine/model/threads.py): every chunk once, the same floats at every
thread count, a late helper taken over, and the measured choice."""
import threading

import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.model import thread_choice as C
from engine.model import threads as T
from engine.model.layout import FEW_ROWS, LAYOUTS, PanelWeight, use_layout
from engine.model.llama import forward

WAIT_S = 10.0      # the most a test waits for a helper thread to be scheduled (it is normally microseconds)


@pytest.fixture
def restore_threads():
    before = T.threads()
    yield
    for threads in (2, 3):
        pool = T.set_threads(threads)
        pool.share, pool.use_processes = None, True
    T.set_threads(before)


def sharing(threads: int, processes: bool = True) -> T.ProductPool:
    """The process's pool of `threads`, sharing every product (not only those measured faster shared): the
    shared products are the ones whose floats the tests compare; few-row products in helper processes, or
    (`processes=False`) all in chunks on the threads."""
    pool = T.set_threads(threads)
    pool.share = True if threads > 1 else None
    pool.use_processes = processes and threads > 1
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
    """The caller's chunks wait until a helper has run one: the pool's helpers do share the work."""
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


def test_a_helper_that_stalls_is_taken_over_and_its_late_result_dropped():
    """A helper stuck in its chunk (here: held on an event, as a preempted thread is held by the scheduler) costs
    the caller its patience, not the helper's delay: the caller computes the chunk itself, and the stuck chunk's
    result, when it comes, goes nowhere."""
    pool = T.ProductPool(2)
    stuck, release, caller = threading.Event(), threading.Event(), threading.get_ident()

    def task(i):
        if threading.get_ident() != caller and not stuck.is_set():
            stuck.set()
            release.wait(WAIT_S)
            return "late"
        if threading.get_ident() == caller and i == 0:
            assert stuck.wait(WAIT_S), "no helper thread took a chunk"
        return i
    try:
        results = pool.run([lambda i=i: task(i) for i in range(6)])
        assert results == list(range(6))
        assert pool.late == 1
    finally:
        release.set()
        pool.close()


def test_an_error_in_a_chunk_reaches_the_caller():
    pool = T.ProductPool(2)

    def boom():
        raise ZeroDivisionError("chunk")
    try:
        with pytest.raises(ZeroDivisionError):
            pool.run([lambda: 1, boom, lambda: 3, lambda: 4])
        for _ in range(3):         # alone, shared, then the faster: each raises
            with pytest.raises(ZeroDivisionError):
                pool.product(boom, pool.chunked(lambda: [lambda: 1, boom], list), "shape")
        assert pool.run([lambda: 1, lambda: 2]) == [1, 2]
    finally:
        pool.close()


def test_each_product_shape_runs_the_way_measured_faster_and_sometimes_the_other():
    """First alone, then shared, then the faster of the two means, and one run in EXPLORE the other way."""
    timing = [0, None, None]
    assert T.share_next(timing, 4) is False                         # the run then sets the alone mean
    timing[1] = 0.002
    assert T.share_next(timing, 4) is True
    timing[2] = 0.001                                               # shared faster
    assert [T.share_next(timing, 4) for _ in range(6)] == [True, False, True, True, True, False]
    timing[1:] = [0.001, 0.002]                                     # alone faster
    assert [T.share_next(timing, 4) for _ in range(4)] == [False, False, False, True]


def test_a_shape_measured_slower_shared_runs_on_the_caller_alone():
    """A busy machine, where sharing costs more than it gives: the averages say so and the caller works alone
    (but for the runs that keep measuring the other way)."""
    pool = T.ProductPool(2)
    try:
        pool.timings["shape"] = [1, 0.001, 0.050]
        ran = [pool.product(lambda: "alone", pool.chunked(lambda: [lambda: 1, lambda: 2], list), "shape")
               for _ in range(pool.EXPLORE - 2)]
        assert ran == ["alone"] * (pool.EXPLORE - 2)
        assert pool.timings["shape"][1] != 0.001 and pool.timings["shape"][2] == 0.050    # the alone mean follows
    finally:
        pool.close()


@pytest.mark.parametrize("padded", [{1: 2}, {2: 4}], ids=["one row as two", "one row as a GEMV"])
@pytest.mark.parametrize("processes", [True, False], ids=["helper processes", "threads only"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_products_are_the_same_floats_at_every_thread_count(layout, processes, padded, restore_threads, monkeypatch):
    """Every row count's call pattern (one row, a few, many; panels' rows padded or not), shared on 1, 2 and 3
    threads: bit for bit."""
    monkeypatch.setattr(PanelWeight, "padded_rows", padded)
    rng = np.random.default_rng(0)
    for c, d in ((576, 960), (128, 704)):
        lw = LAYOUTS[layout](rng.standard_normal((c, d)).astype(np.float32))
        x = rng.standard_normal((24, c)).astype(np.float32)
        T.set_threads(1)
        one = [T.vec_product(x[0], lw)] + [T.rows_product(x[:n], lw) for n in (1, 2, 3, 5, FEW_ROWS, 24)]
        for threads in (2, 3):
            pool = sharing(threads, processes)
            far = pool.processes()
            before = far.products if far else 0
            many = [T.vec_product(x[0], lw)] + [T.rows_product(x[:n], lw) for n in (1, 2, 3, 5, FEW_ROWS, 24)]
            assert (far.products - before == 6) if processes else far is None     # every product of few rows
            for a, b in zip(one, many):
                assert np.array_equal(a, b)


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


def test_the_choice_is_measured_per_thread_count_and_says_why(make_model, restore_threads):
    plain, weights = make_model("tiny", hidden_size=128, intermediate_size=320, vocab_size=704, seed=5)
    model = use_layout(type(plain)(plain.cfg, weights), "out_in")
    choice = C.choose_threads(model, cores=2, rounds=2)
    assert set(choice.step_ms) == set(choice.read_ms) == {1, 2}
    assert choice.threads in (1, 2) and choice.reason
    assert all(v > 0 for v in choice.read_gb_per_s().values())
    one = C.choose_threads(model, cores=1, rounds=1)
    assert one.threads == 1 and "one core" in one.reason and set(one.step_ms) == {1}
    served = C.choose_threads(model, cores=2, rounds=1, serving=True)        # measured both, takes one
    assert set(served.step_ms) == {1, 2} and served.threads == 1 and "a server leaves one core" in served.reason


def test_more_threads_are_chosen_on_the_median_rounds_step_gain_and_not_on_the_read():
    def picked(gain, cores=4, serving=False):
        counts = range(1, len(gain) + 2)
        choice = C.ThreadChoice(1, "", cores, {n: 30.0 for n in counts}, {n: 20.0 + n for n in counts},
                                {1: 1.0, **{n: g for n, g in zip(counts[1:], gain)}}, 540_000_000)
        C.pick(choice, serving)
        return choice
    two = picked([1.28, 1.30])                  # the read slower at 2 and 3 threads: the step decides
    assert two.threads == 2 and "1.28x as fast as one (the median round)" in two.reason
    assert picked([1.28, 1.36]).threads == 3    # 1.36 / 1.28 >= STEP_GAIN
    assert picked([1.04, 1.03]).threads == 1    # below STEP_GAIN
    one = picked([1.04], cores=2)
    assert one.threads == 1 and "2 threads 1.04x" in one.reason
    assert picked([1.3], cores=2, serving=True).threads == 1

def test_a_default_leaves_a_core_free_from_four_cores_on_and_a_servers_on_every_machine():
    assert [C.candidate_threads(c) for c in (1, 2, 3, 4, 8, 64)] == [1, 2, 3, 3, 7, C.MAX_THREADS]
    assert [C.candidate_threads(c, serving=True) for c in (1, 2, 3, 4, 8, 64)] == [1, 1, 2, 3, 7, C.MAX_THREADS]


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
