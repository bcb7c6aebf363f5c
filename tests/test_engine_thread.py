"""The engine thread (app/ws/engine_thread.py), without a web server.

The engine thread runs the scheduler for every session; these tests drive it from an asyncio loop as the
app does, with pacing objects standing in for connections. Waits are bounded.
"""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from manual_clock import ManualClock
from ws_client import run

from app.metrics import ServerMetrics
from app.ws.engine_thread import PARKED, EngineThread, SessionLink
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

PROMPTS = ["def add(a, b):\n    return a", "class Foo:\n    def __init__(self", "import os\nimport s",
           "for i in range(10):\n    print(i", "x = [1, 2, 3]\ny = x"]


@pytest.fixture(scope="module")
def registry(models_dir):
    return ModelRegistry.from_dir(models_dir, fetched=False)


def pacing(paused=False, speed=None, delivery_delay_s=0.0):
    return SimpleNamespace(paused=paused, speed=speed, steps_granted=0, delivery_delay_s=delivery_delay_s)


class Collector:
    """A connection's stand-in: collects delivered batches (on the loop) and says when one ends."""

    def __init__(self):
        self.batches, self.parked = [], 0
        self.ended = asyncio.Event()

    def __call__(self, item):
        if item is PARKED:
            self.parked += 1
            return
        self.batches.append(item)
        if item[-1].type in ("done", "error"):
            self.ended.set()

    @property
    def events(self):
        return [e for b in self.batches for e in b]


class GateLog(SessionLink):
    """A link that keeps its gate's answers, each with the time it read on the thread's clock."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.answers: list[tuple[float, bool]] = []     # appended in the engine thread

    def may_continue(self) -> bool:
        go = super().may_continue()
        self.answers.append((self.thread.clock(), go))
        return go


def blocks_used(engine) -> int:
    return sum(m.pool.num_used_blocks for m in engine.managers.values())


def test_sessions_run_together_batched_with_the_same_output_as_alone(registry):
    engine = InferenceEngine(registry, max_sessions=8)
    settings = {"max_tokens": 30, "method": "draft_model", "num_speculative_tokens": 3}
    alone = [list(GenerationSession(engine, p, settings).events())[-1].summary["text"] for p in PROMPTS]

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), ServerMetrics(), chunk_seconds=None)
        thread.start()
        sessions = [GenerationSession(engine, p, settings) for p in PROMPTS]
        collectors = [Collector() for _ in sessions]
        for s, c in zip(sessions, collectors):
            await thread.add(s, SessionLink(s, pacing(), c, requested_at=time.perf_counter()))
        for c in collectors:
            await c.ended.wait()
        await thread.stop()
        return thread, collectors

    thread, collectors = run(scenario())
    assert [c.events[-1].summary["text"] for c in collectors] == alone
    assert thread.scheduler.batches > 0 and thread.scheduler.batched_requests >= 2 * thread.scheduler.batches
    for c in collectors:                    # a delivered batch is one round: it ends with started/metrics/done
        assert [b[-1].type for b in c.batches][:2] == ["started", "metrics"]
        assert all(b[-1].type in ("metrics", "done") for b in c.batches[1:])
    assert blocks_used(engine) == 0


def test_a_paused_session_waits_before_its_prefill_and_steps_one_round_at_a_time(registry):
    engine = InferenceEngine(registry, max_sessions=4)

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop())
        thread.start()
        held, runner = pacing(paused=True), pacing()
        a = GenerationSession(engine, PROMPTS[0], {"max_tokens": 20})
        b = GenerationSession(engine, PROMPTS[1], {"max_tokens": 20})
        ca, cb = Collector(), Collector()
        await thread.add(a, SessionLink(a, held, ca))
        await thread.add(b, SessionLink(b, runner, cb))
        await cb.ended.wait()                             # the paused one holds only itself
        assert [e.type for e in ca.events] == ["started"] and ca.parked == 1
        assert blocks_used(engine) == 0                   # not even its prefill ran
        for expected_rounds in (1, 2):
            held.steps_granted += 1
            thread.poke()
            while sum(e.type == "metrics" for e in ca.events) < expected_rounds or ca.parked < expected_rounds + 1:
                await asyncio.sleep(0.01)
            assert sum(e.type == "metrics" for e in ca.events) == expected_rounds    # exactly one round per step
        held.paused = False
        thread.poke()
        await ca.ended.wait()
        await thread.stop()
        return ca

    ca = run(scenario())
    assert ca.events[-1].type == "done"
    assert blocks_used(engine) == 0


def test_a_client_that_does_not_take_its_rounds_holds_its_session_only(registry):
    engine = InferenceEngine(registry, max_sessions=4)

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), chunk_seconds=None)   # rounds only
        thread.start()
        slow = GenerationSession(engine, PROMPTS[0], {"max_tokens": 200, "method": "none"})
        fast = GenerationSession(engine, PROMPTS[1], {"max_tokens": 60})
        cs, cf = Collector(), Collector()
        link = SessionLink(slow, pacing(), cs, max_backlog=3)
        await thread.add(slow, link)
        await thread.add(fast, SessionLink(fast, pacing(), cf))
        await cf.ended.wait()
        while link.held != "client":
            await asyncio.sleep(0.01)
        assert len(cs.batches) == 3 and not cs.ended.is_set()       # three rounds, then it waits
        link.rounds_taken = len(cs.batches)                          # the client catches up
        thread.poke()
        while len(cs.batches) < 6:
            await asyncio.sleep(0.01)
        await thread.remove(slow)                                    # a disconnect: blocks freed at once
        assert blocks_used(engine) == 0
        await thread.stop()

    run(scenario())


def test_an_engine_bug_ends_its_session_with_an_error_and_the_others_go_on(registry, monkeypatch):
    engine = InferenceEngine(registry, max_sessions=4)
    original = GenerationSession._round

    def broken(self):
        if self.settings.seed == 13 and self.round >= 1:
            raise RuntimeError("simulated engine bug")
        return original(self)

    monkeypatch.setattr(GenerationSession, "_round", broken)

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop())
        thread.start()
        bad = GenerationSession(engine, PROMPTS[0], {"max_tokens": 30, "seed": 13})
        good = GenerationSession(engine, PROMPTS[0], {"max_tokens": 30})
        cb, cg = Collector(), Collector()
        await thread.add(bad, SessionLink(bad, pacing(), cb))
        await thread.add(good, SessionLink(good, pacing(), cg))
        await cb.ended.wait()
        await cg.ended.wait()
        await thread.stop()
        return cb, cg

    cb, cg = run(scenario())
    assert cb.events[-1].type == "error" and "simulated engine bug" in cb.events[-1].message
    assert cg.events[-1].type == "done"
    assert blocks_used(engine) == 0


def test_speed_paces_rounds_on_the_threads_clock_and_holds_only_its_own_session(registry):
    """At 20 rounds a second, a session's next round goes once 50 ms have passed since its last on the engine
    thread's clock (the test's own: it stands still until the test moves it), never before; a session at full
    speed beside it runs to its end meanwhile."""
    engine = InferenceEngine(registry, max_sessions=4)
    clock = ManualClock()

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), chunk_seconds=None, clock=clock)
        thread.start()
        paced = GenerationSession(engine, PROMPTS[0], {"max_tokens": 200, "method": "none"})
        free = GenerationSession(engine, PROMPTS[1], {"max_tokens": 40, "method": "none"})
        cp, cf = Collector(), Collector()
        link = GateLog(paced, pacing(speed=20), cp, max_backlog=10_000)
        await thread.add(paced, link)
        await thread.add(free, SessionLink(free, pacing(), cf, max_backlog=10_000))
        await asyncio.wait_for(cf.ended.wait(), 60)

        def rounds() -> int:
            return sum(e.type == "metrics" for e in cp.events)

        async def rounds_after(seconds: float) -> int:
            clock.advance(seconds)
            now = clock()
            thread.poke()
            while not any(at >= now and not go for at, go in link.answers):   # held again, at this time
                await asyncio.sleep(0.005)
            await thread.call(lambda: None)          # its result comes after the events of the steps before
            return rounds()

        seen = [await rounds_after(0.0), await rounds_after(0.049), await rounds_after(0.002),
                await rounds_after(0.0), await rounds_after(0.05), await rounds_after(0.2)]
        await thread.remove(paced)
        await thread.stop()
        return seen, sum(e.type == "metrics" for e in cf.events), cf.events[-1].type

    seen, free_rounds, free_end = run(scenario())
    # round 0 (the prefill and the first token) at once; then one round per 50 ms, however long the pause
    assert seen == [1, 1, 2, 2, 3, 4], seen
    assert free_end == "done" and free_rounds >= 40


def test_a_delivery_delay_posts_rounds_to_the_loop_together_and_loses_none(registry):
    """A page at full speed lets its rounds wait to be posted together (each post wakes the event loop and
    takes the GIL from the engine thread); the first token and the end of the run are posted at once,
    however long the delay."""
    engine = InferenceEngine(registry, max_sessions=4)

    async def scenario(delay: float):
        # whole prefills: the second run's prompt comes from the prefix cache, and would have no chunks
        thread = EngineThread(engine, asyncio.get_running_loop(), chunk_seconds=None)
        thread.start()
        s = GenerationSession(engine, PROMPTS[0], {"max_tokens": 80, "method": "none"})
        c = Collector()
        # a backlog limit the run never reaches: the gate never holds it, whenever the loop takes its rounds
        await thread.add(s, SessionLink(s, pacing(delivery_delay_s=delay), c, max_backlog=10_000))
        await c.ended.wait()                # a delay of an hour: `done` still comes at once
        await thread.stop()
        return thread.posts, c

    posts_at_once, at_once = run(scenario(0.0))
    posts_delayed, delayed = run(scenario(3600.0))
    assert [len(b) for b in delayed.batches] == [len(b) for b in at_once.batches]      # every round, one batch each
    assert delayed.events[-1].summary["text"] == at_once.events[-1].summary["text"]
    assert len(at_once.batches) == 82 and posts_at_once >= 80     # started, 80 rounds, done: a post (nearly) each
    assert posts_delayed == 2                  # `started` and round 0 (the first token), then the rest with `done`


def test_rounds_waiting_to_be_posted_go_once_half_the_gates_limit_wait(registry):
    """So that a connection's sender can take them before the gate would hold the session for its client."""
    engine = InferenceEngine(registry, max_sessions=4)

    async def scenario():
        # whole prefills: a chunked one posts what comes before its chunks at once (one post more)
        thread = EngineThread(engine, asyncio.get_running_loop(), chunk_seconds=None)
        thread.start()
        s = GenerationSession(engine, PROMPTS[0], {"max_tokens": 200, "method": "none"})
        c = Collector()                     # takes nothing: the gate holds the session after 32 rounds
        link = SessionLink(s, pacing(delivery_delay_s=3600.0), c, max_backlog=32)
        await thread.add(s, link)
        while link.held != "client" or len(c.batches) < 32:
            await asyncio.sleep(0.01)
        posts, batches = thread.posts, len(c.batches)
        await thread.remove(s)
        await thread.stop()
        return posts, batches

    # `started` and round 0 at once (the first token), rounds 1-16 at half the limit, then the rest up to the
    # limit of 32 batches when the held session leaves the thread idle
    assert run(scenario()) == (3, 32)


def test_metrics_count_what_the_sessions_report(registry):
    engine = InferenceEngine(registry, max_sessions=4)
    metrics = ServerMetrics()

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), metrics)
        thread.start()
        sessions = [GenerationSession(engine, p, {"max_tokens": 25, "num_speculative_tokens": 3}) for p in PROMPTS[:3]]
        collectors = [Collector() for _ in sessions]
        for s, c in zip(sessions, collectors):
            await thread.add(s, SessionLink(s, pacing(), c, requested_at=time.perf_counter()))
        for c in collectors:
            await c.ended.wait()
        await thread.stop()
        return [c.events[-1].summary for c in collectors]

    summaries = run(scenario())
    model = summaries[0]["model"]["name"]
    value = metrics.value
    assert value("vllm:spec_decode_num_draft_tokens_total", model_name=model) == \
        sum(s["num_draft_tokens"] for s in summaries)
    assert value("vllm:spec_decode_num_accepted_tokens_total", model_name=model) == \
        sum(s["num_accepted_tokens"] for s in summaries)
    assert value("vllm:spec_decode_num_drafts_total", model_name=model) == sum(s["num_drafts"] for s in summaries)
    assert value("vllm:generation_tokens_total", model_name=model) == sum(s["num_output_tokens"] for s in summaries)
    per_pos = [value("vllm:spec_decode_num_accepted_tokens_per_pos_total", model_name=model, position=str(i)) or 0
               for i in range(3)]
    assert per_pos == [sum(s["accepted_per_position"][i] if i < len(s["accepted_per_position"]) else 0
                           for s in summaries) for i in range(3)]
    assert value("vllm:time_to_first_token_seconds_count", model_name=model) == 3
    text = metrics.render([])
    # prometheus_client's text format (as vLLM's /metrics): a counter's TYPE line names its `_total` sample,
    # `le` comes first among a bucket's labels, values are floats
    assert "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter" in text
    assert f'vllm:spec_decode_num_draft_tokens_total{{model_name="{model}"}}' in text
    assert f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{model}"}} 3.0' in text


def test_a_teaching_job_runs_between_the_sessions_steps_and_they_keep_generating(registry):
    """A fault comparison submitted as a job (engine/serving/jobs.py) gets the same answer as run alone, while a session
    started after it keeps delivering rounds before the job has finished: no engine work waits for a whole job."""
    from engine.experiments.traces import fault_comparison_steps
    from engine.serving.jobs import run_to_end

    engine = InferenceEngine(registry, max_sessions=8)
    settings = {"max_tokens": 24, "method": "draft_model", "num_speculative_tokens": 3}
    alone = run_to_end(fault_comparison_steps(engine, PROMPTS[0], settings, "no_truncate"))

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), ServerMetrics(), chunk_seconds=None)
        thread.start()
        job = thread.submit(fault_comparison_steps(engine, PROMPTS[0], settings, "no_truncate"))
        session = GenerationSession(engine, PROMPTS[1], {**settings, "max_tokens": 60})
        rounds_before_job_done = []
        collector = Collector()
        job.add_done_callback(lambda _: rounds_before_job_done.append(len(collector.batches)))
        await thread.add(session, SessionLink(session, pacing(), collector))
        result = await asyncio.wait_for(job, 60)
        await asyncio.wait_for(collector.ended.wait(), 60)
        closed, loop = asyncio.Event(), asyncio.get_running_loop()

        class Endless:                                  # a job that only ends when the thread closes it
            def __iter__(self):
                return self

            def __next__(self):
                return None

            def close(self):
                loop.call_soon_threadsafe(closed.set)

        cancelled = thread.submit(Endless())
        cancelled.cancel()                              # its request went away: the thread drops the job
        await asyncio.wait_for(closed.wait(), 60)
        await thread.stop()
        return result, rounds_before_job_done[0]

    result, rounds = run(scenario())
    assert result["faulty"]["emitted_ids"] == alone["faulty"]["emitted_ids"]
    assert result["divergence"] == alone["divergence"]
    assert rounds >= 2, "the session delivered no round while the job ran"
    assert blocks_used(engine) == 0


def test_a_patient_job_waits_for_an_idle_thread_and_takes_steps_once_hurried(registry):
    """The curve `serve` measures at start-up nobody waits for yet: a step of it forced between a run's rounds
    would stall that run's stream. It takes none while a session moves, even past job_max_wait_s, and runs once
    the thread is idle; hurried (a view asks for it), it takes steps between the session's rounds."""
    engine = InferenceEngine(registry, max_sessions=8)

    async def scenario():
        thread = EngineThread(engine, asyncio.get_running_loop(), ServerMetrics(), chunk_seconds=None,
                              job_max_wait_s=0.0)

        def job(steps: list):                           # per step: whether a session was in the scheduler
            while True:                                 # until its future is cancelled
                steps.append(bool(thread.scheduler.entries))
                yield

        async def idle_steps(steps: list) -> None:      # the session has ended: the job runs
            while not (len(steps) >= 5 and not steps[-1]):
                await asyncio.sleep(0.02)

        thread.start()
        counts = []
        for hurry in (False, True):
            session = GenerationSession(engine, PROMPTS[1], {"max_tokens": 40, "method": "none"})
            collector, steps = Collector(), []
            await thread.add(session, SessionLink(session, pacing(), collector, max_backlog=10_000))
            future = thread.submit(job(steps), patient=True)
            if hurry:
                thread.hurry(future)
            await asyncio.wait_for(collector.ended.wait(), 60)
            await asyncio.wait_for(idle_steps(steps), 60)
            future.cancel()
            counts.append((sum(steps), len(steps)))
        await thread.stop()
        return counts

    (patient_during, patient_all), (hurried_during, _) = run(scenario())
    assert patient_during == 0 and patient_all >= 5
    assert hurried_during >= 10, "a hurried job took no steps between the session's rounds"
