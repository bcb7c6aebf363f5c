"""A run's engine time is its own work (engine/serving/clock.py): not the other sessions' and jobs' steps the
engine thread runs between its rounds (app/ws/engine_thread.py), nor waiting. Waits are bounded."""
from __future__ import annotations

import asyncio
import time

import pytest
from manual_clock import ManualClock, use_as_engine_clock
from test_engine_thread import Collector, pacing
from ws_client import run

from app.metrics import ServerMetrics
from app.ws.engine_thread import EngineThread, SessionLink
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

PROMPT = "def add(a, b):\n    return a"
SETTINGS = {"max_tokens": 120, "method": "none"}
JOB_STEP_S = 1.0         # what each step of the job below takes on the engine clock


@pytest.fixture
def manual_clock(monkeypatch):
    return use_as_engine_clock(monkeypatch, ManualClock(tick=1e-6))     # every stretch of work takes some time


@pytest.fixture(scope="module")
def engine(models_dir):
    return InferenceEngine(ModelRegistry.from_dir(models_dir, fetched=False), max_sessions=4)


def test_a_run_s_engine_time_leaves_out_a_job_run_between_its_rounds(engine, manual_clock):
    """A job steps between every two of the session's scheduler steps (as a job that waited its longest does),
    and each of its steps takes a second on the engine clock: the run's engine time counts none of them."""
    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), ServerMetrics(), job_max_wait_s=0.0)
        session = GenerationSession(engine, PROMPT, SETTINGS)
        collector = Collector()
        link = SessionLink(session, pacing(), collector, max_backlog=10_000)   # the gate never holds it
        rounds_at_job_steps = []

        def job():
            while True:
                yield
                manual_clock.advance(JOB_STEP_S)
                rounds_at_job_steps.append(link.rounds_sent)

        thread.start()
        future = thread.submit(job())
        await thread.add(session, link)
        await asyncio.wait_for(collector.ended.wait(), 60)
        future.cancel()
        await thread.stop()
        return collector.events[-1], rounds_at_job_steps

    done, rounds_at_job_steps = run(scenario())
    summary = done.summary
    tokens = summary["num_output_tokens"]
    between_rounds = sum(1 <= r <= tokens for r in rounds_at_job_steps)    # after round 0, before `done`
    assert between_rounds >= tokens // 2, (between_rounds, tokens)          # ... so that counting them would show
    assert 0 < summary["ttft_s"] <= summary["elapsed_s"] < JOB_STEP_S, summary


def test_a_forward_request_carries_its_own_time_and_the_session_counts_it_once(engine):
    """Alone (`events()`), a run's engine time is its forwards plus its own code: at least the sum of its
    forwards' times, and not more than its wall time."""
    session = GenerationSession(engine, PROMPT, SETTINGS)
    t = time.perf_counter()
    summary = [e for e in session.events() if e.type == "done"][0].summary
    wall = time.perf_counter() - t
    forwards = summary["target_time_s"] + summary["draft_time_s"]
    assert forwards <= summary["elapsed_s"] <= wall


def test_the_clock_is_the_thread_s_cpu_time_and_its_waits_for_helper_threads(engine):
    """A model whose weight products run on helper threads (engine/model/threads.py) is timed on the caller's
    CPU time plus the helpers' CPU time beyond it (`shared_clock`): the caller's CPU time alone would miss the
    helpers' part."""
    import copy

    from engine.kv.runner import clock_for
    from engine.model.layout import use_layout
    from engine.model.threads import shared_clock, using_threads

    arrays = engine.registry.default_target().model
    streamed = use_layout(copy.deepcopy(arrays), "out_in")
    with using_threads(1):           # the process's count is measured when SmolLM2 loads: either may be chosen
        assert clock_for(arrays) is time.thread_time and clock_for(streamed) is time.thread_time
    with using_threads(2):
        assert clock_for(arrays) is time.thread_time                 # its products never use the helpers
        assert clock_for(streamed) is shared_clock


def test_a_shared_product_is_timed_as_its_busiest_thread_and_no_wait_counts():
    """`shared_clock` over products shared with a helper thread (engine/model/threads.py's `ProductPool.run`): the
    caller's CPU time plus the helper's beyond it, so a product takes as long as its busiest thread, and waiting
    (for the other thread, for the GIL, for a core) counts nothing. The work is set in CPU time, so other processes
    on the cores change nothing: a task on the helper spins until its thread's CPU clock has moved by
    `helper_task_s`; on the caller it only waits until the helper has begun one (so the helper always shares the
    product, and the caller's own CPU time alone would miss its part). A Python thread that holds the GIL in turns
    runs beside every other product."""
    import threading

    from engine.model.threads import shared_clock, using_threads

    helper_task_s, tasks_per_product = 0.02, 6
    caller = threading.get_ident()

    def product(pool):  # -> (shared_clock's time, the caller's CPU time, the helper's tasks' CPU time, tasks run)
        helper_began, helper_ended, helper_cpu, runs = threading.Event(), threading.Event(), [], []

        def task():
            runs.append(threading.get_ident())
            if threading.get_ident() == caller:
                assert helper_began.wait(30), "the helper took no task"
                return
            helper_began.set()
            t = time.thread_time()
            while time.thread_time() - t < helper_task_s:
                pass
            helper_cpu.append(time.thread_time() - t)
            helper_ended.set()

        clock, cpu = shared_clock(), time.thread_time()
        pool.run([task] * tasks_per_product)
        clock, cpu = shared_clock() - clock, time.thread_time() - cpu
        assert helper_ended.wait(30)
        return clock, cpu, sum(helper_cpu), len(runs)

    stop = threading.Event()

    def python_busy():
        n = 0
        while not stop.is_set():
            n = (n * 31 + 7) % 1_000_003

    timings = []
    with using_threads(2) as pool:
        for i in range(6):
            spinner = threading.Thread(target=python_busy) if i % 2 else None
            if spinner is not None:
                spinner.start()
            try:
                timings.append(product(pool))
            finally:
                stop.set()
                if spinner is not None:
                    spinner.join()
                stop.clear()
    for clock, caller_cpu, helper_cpu, runs in timings:
        assert helper_cpu >= helper_task_s and caller_cpu < helper_cpu, timings     # the helper's part is the larger
        # no wait counts: at most both threads' CPU time (and the little each spends around the tasks: 1 ms)
        assert caller_cpu <= clock <= helper_cpu + caller_cpu + 0.001, timings
        if runs == tasks_per_product:        # the pool took the helper's results (none computed again by the caller)
            assert clock >= helper_cpu, timings                # ... so its part counts
