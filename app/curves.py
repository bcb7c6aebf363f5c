"""This machine's verify-cost curves (engine/experiments/measure.py's `verify_cost_steps`), one per model, measured
on the engine thread as a job, which takes the thread when the sessions leave it idle (app/ws/engine_thread.py):
a curve never runs inside a live run's timing. `serve` measures the page's demo model's at start-up, as a patient
job (only while no run moves: nobody waits for it yet), and so does the Theory view, which says so while it waits;
the Cost card and /teach/curve.json wait for theirs, and hurry one under way.

    curves.start(playground, lm)      # begin measuring (no-op when measured or under way); event loop only
    curves.start(playground, lm, patient=True)    # the same, in idle moments only (start-up)
    curves.peek(playground, lm)       # the curve, or None while it is measured, patiently (the Theory view, polled)
    await curves.get(playground, lm)  # the curve, waiting for it (the Cost card, /teach/curve.json)

A curve that is not physical (t(n) < t(1) beyond its noise, twice) is kept, flagged, and measured again when
asked for RETRY_S after it was taken. A curve is a model's at the process's weight-product thread count
(engine/model/threads.py): the step's cost follows it.
"""
from __future__ import annotations

import asyncio
import logging
import time

from engine.experiments.measure import verify_cost_steps
from engine.model.threads import threads

logger = logging.getLogger(__name__)
RETRY_S = 60.0


class VerifyCurves:
    def __init__(self):
        self.curves: dict[tuple[str, int], dict] = {}        # (model, weight-product threads) -> its curve
        self.jobs: dict[tuple[str, int], asyncio.Future] = {}

    def start(self, playground, lm, patient: bool = False) -> asyncio.Future | None:
        """The measurement of `lm`'s curve under way, started if needed (None: a good curve is kept); patient:
        nobody waits for it yet (app/ws/engine_thread.py)."""
        key = (lm.name, threads())
        kept = self.curves.get(key)
        if kept is not None and (kept["physical"] or time.time() - kept["taken_at"] < RETRY_S):
            return None
        job = self.jobs.get(key)
        if job is None:
            job = self.jobs[key] = playground.engine_thread.submit(verify_cost_steps(playground.engine.registry, lm),
                                                                   patient)
            job.add_done_callback(lambda f: self._done(key, f))
        elif not patient:
            playground.engine_thread.hurry(job)           # a no-op for a job already hurried
        return job

    def _done(self, key: tuple, future: asyncio.Future) -> None:
        self.jobs.pop(key, None)
        if future.cancelled():
            return
        if future.exception() is not None:
            logger.warning("measuring the verify curve of %s failed: %s", key[0], future.exception())
            return
        self.curves[key] = future.result()

    def peek(self, playground, lm) -> dict | None:
        self.start(playground, lm, patient=True)   # the Theory view says it comes once the engine is idle
        return self.curves.get((lm.name, threads()))

    async def get(self, playground, lm) -> dict:
        job = self.start(playground, lm)
        if job is not None:                  # the first measurement, or a flagged curve's next one
            await asyncio.shield(job)
        return self.curves[(lm.name, threads())]
