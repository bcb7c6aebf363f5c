"""What every teaching view's endpoint shares: its fragments, the form as htmx sends it, numbers from a query,
engine jobs at most one of a kind at a time (so a room of viewers cannot queue engine work here), and the
worker threads and processes that read and render what clients upload, a few at a time."""
from __future__ import annotations

import asyncio
import multiprocessing
import sys
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import parse_qsl

import anyio
from fastapi import Request
from fastapi.responses import HTMLResponse

from app.views.page import FORM_SETTINGS
from app.views.recording import RECORDINGS
from app.views.templating import templates
from engine.serving.settings import GenerationSettings, SettingsError


def fragment(request: Request, name: str, **context) -> HTMLResponse:
    return templates.TemplateResponse(request, f"teach/{name}.html", context)


def error_fragment(request: Request, message: str) -> HTMLResponse:
    """An error, with status 200: htmx does not swap a 4xx answer."""
    return fragment(request, "error", message=message)


class BusyError(RuntimeError):
    pass


class OneAtATime:
    """At most one job of a kind at a time (event loop only; a second one is told to wait)."""

    def __init__(self):
        self.busy = False

    @contextmanager
    def taken(self):
        if self.busy:
            raise BusyError()
        self.busy = True
        try:
            yield
        finally:
            self.busy = False


RUNS = OneAtATime()        # faults, race, shoot-out, the Theory view's plain run


WORKER_SWITCH_INTERVAL_S = 0.0005     # the GIL's switch interval while a worker runs (Python's default: 5 ms)


class WorkerSlots:
    """Work a client's request brings that reads no engine state (reading an uploaded recording and rendering its
    frames, in a process; building a one-file page or a file, in a thread) runs at most `size` at a time. Beyond
    that a request waits up to `wait_s` for a turn, then gets BusyError.

    NOTE: a worker thread's Python shares the GIL with the event loop and the engine thread. Each of those waits for it
    up to the switch interval each time it wakes while a worker runs, and the engine thread wakes at every
    weight product it hands to BLAS: at the default 5 ms a decode step took seconds beside one upload. So while a
    worker runs, the interval is WORKER_SWITCH_INTERVAL_S. With more workers at once the waits grow, and none
    finishes sooner (they take turns on the one GIL). Hence a small `size`."""

    def __init__(self, size: int, wait_s: float, preload: list[str] = ()):
        self.size, self.wait_s, self.preload = size, wait_s, list(preload)
        self.running = 0
        self._processes: ProcessPoolExecutor | None = None
        self._turns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # event loop -> its semaphore

    @asynccontextmanager
    async def turn(self):
        turns = self._turns.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(self.size))
        try:
            async with asyncio.timeout(self.wait_s):
                await turns.acquire()
        except TimeoutError:
            raise BusyError() from None
        if self.running == 0:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(WORKER_SWITCH_INTERVAL_S)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self.running == 0:
                sys.setswitchinterval(self._switch_interval)
            turns.release()

    async def run(self, fn, *args):
        """`fn(*args)` in a worker thread, when a turn is free."""
        async with self.turn():
            return await anyio.to_thread.run_sync(fn, *args)

    async def in_process(self, fn, *args):
        """`fn(*args)` in a process of its own, during a turn the caller holds (`turn()`): its Python takes no GIL
        of ours. Each call gets a fresh process, forked from a server process that imported only what `preload`
        names, so that nothing a file leaves behind outlives it. `fn`, its arguments and its answer are pickled."""
        if self._processes is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(self.preload)
            self._processes = ProcessPoolExecutor(self.size, mp_context=context, max_tasks_per_child=1)
        try:                # (submitting may start a process and wait for it: not on the event loop)
            return await asyncio.wrap_future(await anyio.to_thread.run_sync(self._processes.submit, fn, *args))
        except BrokenProcessPool:
            self._processes = None              # (a reader killed, e.g. out of memory: the next call starts over)
            raise


UPLOADS = WorkerSlots(size=1, wait_s=3.0, preload=["app.views.replay"])


async def teaching_run(request: Request, playground, max_tokens: int, run) -> HTMLResponse:
    """What every teaching run's endpoint does around its own part: the form read, its `max_tokens` capped, then
    `await run(prompt, settings, fields)` (the fragment), and bad input or a busy engine answered as fragments."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        prompt, settings, fields = await settings_from(request)
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, max_tokens)
        return await run(prompt, settings, fields)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison, race or shoot-out is running: try again in a moment.")


async def run_job(playground, job, kind: OneAtATime):
    """A job (engine/serving/jobs.py) on the engine thread, its steps between the other sessions' (BusyError while
    another of its kind runs)."""
    try:
        with kind.taken():
            return await on_engine_thread(playground, job)
    finally:
        job.close()           # never started (busy): a no-op otherwise


async def on_engine_thread(playground, job):
    """A job on the engine thread, for a caller that holds its kind's turn itself."""
    try:
        return await playground.engine_thread.submit(job)
    finally:
        job.close()


async def form_fields(request: Request) -> dict:
    """A form as htmx sends it (url-encoded): text values, the last of repeated names (a checkbox and its
    hidden twin). Parsed here: starlette's form parser needs python-multipart, which nothing else needs.
    The body is at most the route's limit (app/body_limits.py: 64 KiB), refused before it is read."""
    body = await request.body()
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


async def settings_from(request: Request) -> tuple[str, dict, dict]:
    """The prompt, the generation settings and all fields of a teaching form."""
    fields = await form_fields(request)
    return fields.get("prompt", ""), {k: fields[k] for k in FORM_SETTINGS if k in fields}, fields


def number(text: str, default, kind=float, low=None, high=None):
    """A query value as the page sends it (possibly empty): parsed, clamped, or the default."""
    try:
        value = kind(text)
    except (TypeError, ValueError):
        return default
    if value != value:           # NaN
        return default
    return min(max(value, low), high)


def model_of(recording: str | None, model: str | None) -> str | None:
    """The target a view is about: the recorded run's, else the form's (None: the default target)."""
    rec = RECORDINGS.get(recording) if recording else None
    if rec is not None and rec.started is not None:
        return rec.started.model.get("name")
    return model or None
