"""A session's engine clock: the time of the session's own work, whatever runs between its steps.

    clock = EngineClock(clock_for(target.model))
    steps = clock.timed(session_steps)      # the session's coroutine, its own segments timed
    t = clock.now(); ...; clock.now() - t   # inside the session: its engine time over a stretch of its code

A session is a coroutine (engine/serving/session.py): it runs until it needs a forward, an event shown or a
round boundary, and then waits while its driver does something else: a scheduler advances other sessions and
runs a batched forward (engine/serving/scheduler.py), a server's engine thread runs teaching jobs' steps and
posts events (app/ws/engine_thread.py), a consumer renders. None of that is this session's work. The clock
runs only while the session's own code runs, and adds each forward's time as whoever ran it measured it
(`ForwardRequest.seconds`: the whole batched forward when the session shared one).

The clock (engine/kv/runner.py's `clock_for`) is the engine thread's CPU time: time the thread waits is not
counted, whether for the GIL (the server's event loop renders the page in another thread), for a core (another
process, the browser) or for anything else. For a model whose weight products also run on helper threads
(`--threads N`, engine/model/threads.py) it adds, per product shared with helper threads, their CPU time beyond
the engine thread's own (it polls for helper processes: its CPU time covers those): a product takes as long as its
busiest thread.
"""
from __future__ import annotations

from typing import Callable

from ..kv.runner import ForwardRequest


class EngineClock:
    def __init__(self, timer: Callable[[], float]):
        self.timer = timer
        self.total = 0.0               # seconds of own work so far
        self._since: float | None = None

    def now(self) -> float:
        """The session's engine time so far (read from inside the session: includes the running segment)."""
        return self.total + (self.timer() - self._since if self._since is not None else 0.0)

    def timed(self, inner):
        """`inner` (a session's coroutine) with its own segments on this clock; sends, throws and close pass
        through to it."""
        value, error = None, None
        try:
            while True:
                self._since = self.timer()
                try:
                    item = inner.send(value) if error is None else inner.throw(error)
                except StopIteration as stop:
                    return stop.value
                finally:
                    self.total += self.timer() - self._since
                    self._since = None
                value = error = None
                try:
                    value = yield item
                except GeneratorExit:
                    raise
                except BaseException as e:  # noqa: BLE001 - a failed forward: handed to the session, which decides
                    error = e
                if isinstance(item, ForwardRequest):
                    self.total += item.seconds
        finally:
            inner.close()
