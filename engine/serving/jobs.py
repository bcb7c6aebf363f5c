"""Engine work in steps: a job is a generator that yields between two steps and returns its result.

    result = run_to_end(verify_curve_steps(lm))     # a command line: all steps now, in this thread
    await engine_thread.submit(verify_curve_steps(lm))  # the server: its steps between the scheduler's

A step is short (one round of a session, one timed forward size, a slice of samples), so the server's
engine thread can run a teaching experiment while every other session keeps generating. A job's figures
are timed inside its steps, never across a yield: what runs between two steps does not count.
"""
from __future__ import annotations

from typing import Generator, TypeVar

T = TypeVar("T")
Job = Generator[None, None, T]


def run_to_end(job: Job[T]) -> T:
    """Every step of `job` now; its result."""
    while True:
        try:
            next(job)
        except StopIteration as stop:
            return stop.value
