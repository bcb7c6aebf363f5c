"""The engine thread: one thread runs every generation of the process, with continuous batching.

    engine_thread = EngineThread(engine, loop)      # in the lifespan; .start() / await .stop()
    link = SessionLink(session, pacing, deliver)    # one generation of one connection
    await engine_thread.add(session, link)          # events now reach deliver(), a round at a time
    await engine_thread.remove(session)             # stop it now and free its KV blocks (idempotent)
    result = await engine_thread.submit(job)        # a teaching experiment (engine/serving/jobs.py), step by step
    engine_thread.submit(job, patient=True)         # one nobody waits for yet: only when the thread is idle
    engine_thread.hurry(future)                     # someone waits for it now

The thread runs the engine's `Scheduler` (engine/serving/scheduler.py): every admitted session advances to its
next forward, and the forwards of the same model run as one batched computation. Between steps it runs
the calls the event loop queued (add, remove), one step of the oldest submitted job (the teaching views'
experiments: a fault comparison, a race, a distribution check, a verify-cost curve; one job at a time) when
no session could move (or when the job has waited `job_max_wait_s` for such a moment), and sends everything
the step produced to the event loop in one `loop.call_soon_threadsafe`.

NOTE (invariants):
- Only this thread touches the scheduler, the sessions' generators and the KV pools (under
  the engine's `lock`). The event loop talks to it through `call()` and `poke()` only.
- It never waits for a client. A session is held at its round boundary by its gate (`may_continue`):
  while its connection has `max_backlog` rounds not yet taken by its sender (a slow client), while it is
  paused (pause, step mode) or while its speed says not yet. A held session holds only itself.
- When nothing can move it sleeps until poked (a command, a client that caught up) or until the earliest
  time a paced session may go on.
- Every post to the event loop wakes it, and it then takes the GIL from this thread: a round waits to be
  posted with later ones for up to its connection's `delivery_delay_s` (a page at full speed, which gets
  at most 10 messages a second anyway). The first token, the end of a generation, a parked session, a
  call's result, half the gate's backlog limit in waiting rounds, and an idle thread post at once.
- BLAS stays at one thread (engine/__init__.py); this is the only thread doing engine work.
- A job disturbs no run: a session's engine time counts only its own work (engine/serving/clock.py), and
  jobs take the thread when the sessions leave it idle, because a job's forwards between two rounds of a
  small model evict its weights from the CPU caches, and the run's next round pays to fetch them again
  (engine time counts that, being its own work). A job that waited
  `job_max_wait_s` for an idle moment takes one step anyway, so a busy server still answers teaching views;
  a patient job (one nobody waits for yet: the curve `serve` measures at start-up) never does, because such a
  step stalls every run's stream (a SmolLM2 forward over the curve's rows takes several decode steps' time).
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from engine.serving.scheduler import CHUNK_SECONDS, Scheduler, ServedSession

logger = logging.getLogger(__name__)

# the last event of a delivered batch (a chunk of a long prefill is one too: the page shows its progress)
ROUND_END = frozenset(("started", "prefill_progress", "metrics", "done", "error"))
PARKED = "parked"            # delivered (instead of events) when a paused session has come to rest
MAX_IDLE_WAIT_S = 1.0        # the thread re-checks its gates at least this often, poked or not
JOB_MAX_WAIT_S = 1.0         # a job waits at most this long for the sessions to leave the thread idle


class Pacing(Protocol):
    """What a gate reads from its connection (written on the event loop only)."""
    paused: bool
    speed: float | None          # rounds per second; None: full speed
    steps_granted: int           # step commands so far
    delivery_delay_s: float      # how long a round may wait to be posted with later ones (0: at once)


class SessionLink:
    """One generation between its connection (event loop) and the engine thread.

    The engine thread calls `may_continue()` at every round boundary and `sink()` with every event; the
    events reach `deliver` on the event loop a round at a time (a list ending with started, metrics, done
    or error), and `PARKED` once a paused session has come to rest.

    NOTE (threads): `pacing`, `stopping` and `rounds_taken` are written on the event loop only; every other
    field in the engine thread only. Each side only reads the other's ints and bools.
    """

    def __init__(self, session, pacing: Pacing, deliver: Callable, max_backlog: int = 32,
                 requested_at: float | None = None):
        self.session, self.pacing, self.deliver, self.max_backlog = session, pacing, deliver, max_backlog
        # event loop side
        self.stopping = False
        self.rounds_taken = 0          # delivered rounds the connection's sender has taken
        # engine thread side
        self.thread: EngineThread | None = None
        self.steps_used = pacing.steps_granted
        self.rounds_sent = 0
        self.unposted = 0              # of them, still waiting in the thread to be posted to the event loop
        self.held: str | None = None   # why the session waits at its boundary: client | paused | speed
        self.last_round_at = -math.inf
        self.round_started_at = 0.0
        self.requested_at = requested_at   # when the start was asked for (None: not timed, e.g. started paused)
        self.first_token_at: float | None = None
        self.model_name = getattr(getattr(session, "target_lm", None), "name", "")
        self._events: list = []

    @property
    def backlog(self) -> int:
        return self.rounds_sent - self.rounds_taken

    # --- engine thread ---------------------------------------------------------------------------
    def may_continue(self) -> bool:
        now = self.thread.clock()
        if self.stopping:              # a stop is seen by the session right after this boundary
            return self._go(now)
        if self.backlog >= self.max_backlog:
            return self._hold("client")
        pacing = self.pacing
        if pacing.paused:
            if self.steps_used < pacing.steps_granted:
                self.steps_used += 1
                return self._go(now)
            return self._hold("paused")
        if pacing.speed is not None:
            due = self.last_round_at + 1.0 / pacing.speed
            if now < due:
                self.thread.wake_at(due)
                return self._hold("speed")
        return self._go(now)

    def _go(self, now: float) -> bool:
        self.held = None
        self.last_round_at = now                          # on the thread's clock (pacing)
        self.round_started_at = time.perf_counter()       # on the metrics' wall clock (inter-token latency)
        return True

    def _hold(self, why: str) -> bool:
        if why != self.held:
            self.held = why
            if why == "paused":
                self.thread.emit(self, PARKED)
        return False

    def sink(self, event) -> None:
        self._events.append(event)
        thread = self.thread
        if thread.metrics is not None:
            thread.metrics.observe(self, event, time.perf_counter())
        if event.type in ROUND_END:
            events, self._events = self._events, []
            self.rounds_sent += 1
            thread.emit(self, events)


@dataclass
class _Job:
    steps: object                    # the job's generator (engine/serving/jobs.py)
    future: asyncio.Future
    patient: bool                    # nobody waits for it yet: it takes steps only when no session can move


class EngineThread:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop, metrics=None,
                 max_num_batched_tokens: int | None = None, chunk_seconds: float | None = CHUNK_SECONDS,
                 job_max_wait_s: float = JOB_MAX_WAIT_S, clock: Callable[[], float] = time.perf_counter):
        self.engine, self.metrics = engine, metrics
        # what pacing, posting and the jobs' waits are timed on (a test gives its own, to set the time itself)
        self.clock = clock
        self.job_max_wait_s = job_max_wait_s
        self._job_step_at = 0.0          # when jobs last took a step
        # a step's first tokens go out before its prefill chunks are computed
        self.scheduler = Scheduler(max_num_batched_tokens, chunk_seconds, before_chunks=lambda: self._flush(at_once=True))
        self.links: dict[str, SessionLink] = {}
        self.steps = 0                   # scheduler steps that moved something
        self.busy_s = 0.0                # time spent in them
        self._loop = loop
        self._calls: deque = deque()
        self._jobs: list[_Job] = []      # submitted jobs, a step each per scheduler step
        self._out: list = []
        self._post_by = math.inf         # when the oldest waiting item of _out must be posted
        self.posts = 0                   # posts of events to the event loop (each wakes it)
        self._wake = threading.Event()
        self._next_wake = math.inf
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    # --- event loop side -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Stop every session (their blocks are freed) and end the thread."""
        if not self._thread.is_alive():
            return
        await self.call(self._remove_all)
        self._stopping = True
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)
        self._run_calls()                          # any call queued while it was stopping

    def call(self, fn: Callable, *args) -> asyncio.Future:
        """Run `fn(*args)` in the engine thread between two steps; the future gets its result.

        Once the thread has ended (the server is shutting down) nothing else touches the engine, so the
        call runs here and now (a late disconnect still frees its session's blocks and never waits forever).
        """
        future = self._loop.create_future()
        if self._stopping or not self._thread.is_alive():
            try:
                future.set_result(fn(*args))
            except Exception as e:  # noqa: BLE001
                future.set_exception(e)
            return future
        self._calls.append((fn, args, future))
        self._wake.set()
        return future

    def submit(self, job, patient: bool = False) -> asyncio.Future:
        """Run a job (engine/serving/jobs.py) in the engine thread, one step between two scheduler steps, so that
        every session keeps generating meanwhile; the future gets its result (or its exception). A job whose
        future is cancelled (its request went away) is closed at its next step. A patient job takes steps only
        when no session can move, until `hurry`."""
        future = self._loop.create_future()
        if self._stopping or not self._thread.is_alive():
            job.close()
            future.set_exception(RuntimeError("the engine thread has stopped (the server is shutting down)"))
        else:
            self.call(self._add_job, job, future, patient)
        return future

    def hurry(self, future: asyncio.Future) -> None:
        """The patient job of `future` (from `submit`) is now waited for: it may take steps as any job."""
        self.call(self._hurry, future)

    async def add(self, session, link: SessionLink) -> None:
        await self.call(self._add, session, link)

    async def remove(self, session) -> None:
        """Stop `session` now (no more events) and free its blocks; harmless if it already ended."""
        await self.call(self._remove, session)

    def poke(self) -> None:
        """Something a gate reads has changed (resume, step, speed, stop, a client caught up)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- engine thread ---------------------------------------------------------------------------
    def wake_at(self, t: float) -> None:
        if t < self._next_wake:
            self._next_wake = t

    def emit(self, link: SessionLink, item) -> None:
        self._out.append((link, item))
        link.unposted += 1
        # round 0 (the prefill and the first token) goes at once too: the page shows its first token as soon
        # as it exists, not up to `delivery_delay_s` later
        at_once = (item is PARKED or item[-1].type in ("done", "error") or item[0].type == "prefill"
                   or link.unposted >= link.max_backlog // 2)
        delay = 0.0 if at_once else link.pacing.delivery_delay_s
        self._post_by = min(self._post_by, self.clock() + delay)

    def _add(self, session, link: SessionLink) -> None:
        link.thread = self
        self.links[session.id] = link
        self.scheduler.add(ServedSession(session), link.sink, link.may_continue)

    def _remove(self, session) -> None:
        self.links.pop(session.id, None)
        if session.id in self.scheduler.entries:
            self.scheduler.remove(session.id)      # closes its generator: the session frees its blocks
        else:
            session.close()                        # never added, or already ended (idempotent)

    def _add_job(self, job, future, patient: bool) -> None:
        if not self._jobs:                         # it waits for an idle moment from now on
            self._job_step_at = self.clock()
        self._jobs.append(_Job(job, future, patient))

    def _hurry(self, future) -> None:
        for j in self._jobs:
            if j.future is future and j.patient:
                j.patient = False
                self._job_step_at = self.clock()

    def _remove_all(self) -> None:
        for entry in list(self.scheduler.entries.values()):
            self._remove(entry.session.session)
        for j in self._jobs:
            j.steps.close()
            self._post(_settle, j.future, False, RuntimeError("the server is shutting down"))
        self._jobs.clear()

    def _main(self) -> None:
        while not self._stopping:
            self._wake.clear()
            self._next_wake = math.inf
            self._run_calls()
            t = time.perf_counter()
            try:
                with self.engine.lock:
                    moved = self.scheduler.step()
            except Exception:  # noqa: BLE001 - a scheduler bug: log it, keep serving the others
                logger.exception("scheduler step failed")
                moved = False
            if moved:
                self.steps += 1
                self.busy_s += time.perf_counter() - t
            if self._jobs and (not moved or self.clock() - self._job_step_at >= self.job_max_wait_s
                               and not all(j.patient for j in self._jobs)):
                self._job_step_at = self.clock()
                moved = self._step_jobs(idle=not moved) or moved
            for session_id in [s for s in self.links if s not in self.scheduler.entries]:
                del self.links[session_id]         # ended by itself (done or error)
            self._flush(at_once=not moved)
            if not moved and not self._calls:
                timeout = min(MAX_IDLE_WAIT_S, max(0.0, self._next_wake - self.clock()))
                self._wake.wait(timeout)

    def _step_jobs(self, idle: bool) -> bool:
        """One step of the oldest submitted job (one at a time: a job's forwards between another's timed ones
        would slow them as they slow a run), of the oldest one someone waits for unless the thread is `idle`;
        jobs whose caller went away are dropped. True if any is left."""
        for entry in [j for j in self._jobs if j.future.done()]:
            entry.steps.close()
            self._jobs.remove(entry)
        entry = next((j for j in self._jobs if idle or not j.patient), None)
        if entry is not None:
            job, future = entry.steps, entry.future
            try:
                with self.engine.lock:
                    next(job)
            except StopIteration as stop:
                self._post(_settle, future, True, stop.value)
                self._jobs.remove(entry)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self._post(_settle, future, False, e)
                self._jobs.remove(entry)
                job.close()
        return bool(self._jobs)

    def _run_calls(self) -> None:
        while self._calls:
            fn, args, future = self._calls.popleft()
            try:
                with self.engine.lock:
                    result, ok = fn(*args), True
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                result, ok = e, False
            self._flush(at_once=True)               # events a call produced go before its result
            self._post(_settle, future, ok, result)

    def _flush(self, at_once: bool = False) -> None:
        if self._out and (at_once or self.clock() >= self._post_by):
            out, self._out, self._post_by = self._out, [], math.inf
            for link, _ in out:
                link.unposted = 0
            self.posts += 1
            self._post(_dispatch, out)

    def _post(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:                       # the loop is closed: the process is ending
            pass


def _settle(future: asyncio.Future, ok: bool, result) -> None:
    if future.done():                              # the caller was cancelled meanwhile
        return
    if ok:
        future.set_result(result)
    else:
        future.set_exception(result)


def _dispatch(out: list) -> None:
    for link, item in out:
        try:
            link.deliver(item)
        except Exception:  # noqa: BLE001 - one connection's bug must not stop the others' events
            logger.exception("delivering to session %s failed", link.session.id)
