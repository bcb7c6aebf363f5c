"""Clocks a test sets itself, so that what it checks about time happens at the times it says, on any machine.

    clock = ManualClock()                                   # stands still until advanced
    EngineThread(engine, loop, clock=clock)                  # pacing, posting and jobs' waits on it
    clock = use_as_engine_clock(monkeypatch, ManualClock(tick=1e-6))    # every session's engine time on it
    clock.advance(1.0)                                      # a second passes, at once
"""
from __future__ import annotations


class ManualClock:
    """A clock the test moves: by `tick` at every reading (so that every stretch of work takes some time) and by
    whatever `advance` adds."""

    def __init__(self, tick: float = 0.0):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def use_as_engine_clock(monkeypatch, clock: ManualClock) -> ManualClock:
    """Every engine clock (engine/kv/runner.py's `clock_for`, as the sessions, their forwards and the scheduler's
    batched forwards read it) is `clock` for the rest of the test."""
    import engine.kv.runner as runner_module
    import engine.serving.scheduler as scheduler_module
    import engine.serving.session as session_module

    for module in (runner_module, session_module, scheduler_module):
        monkeypatch.setattr(module, "clock_for", lambda model: clock)
    return clock
