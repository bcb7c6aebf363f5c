"""A scheduler for many sessions at once, with continuous batching.

Each session runs as a coroutine (`GenerationSession.steps()`): it yields events, forward requests and
round boundaries. The scheduler advances every session to its next forward request, then runs the
requests of the same model as one batched computation (`engine.model.forward_batch`): one matrix
product per layer for all sessions' rows, attention per sequence through its own block table.

NOTE (invariants):
- Single-threaded: `step()` and `add()`/`remove()` are called from one engine thread only; sinks and
  `may_continue` callbacks must be cheap and thread-safe on their side (they run in that thread).
- A session waits at a round boundary until its `may_continue()` says go: pacing (pause, step mode,
  slow motion) holds a session without holding the others.
- A forward that raises (e.g. the pool is full) is thrown back into its own session only.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from .events import Error
from .model import forward_batch
from .runner import ROUND_BOUNDARY, ForwardRequest, PagedRunner


@dataclass
class _Entry:
    session: object
    gen: object
    sink: Callable
    may_continue: Callable[[], bool]
    state: str = "ready"            # ready | waiting (a request pending) | parked (at a boundary) | done
    request: ForwardRequest | None = None
    value: object = None
    error: BaseException | None = None
    stats: dict = field(default_factory=lambda: {"batched_forwards": 0, "rows": 0})


class Scheduler:
    def __init__(self):
        self.entries: dict[str, _Entry] = {}
        self.batches = 0              # batched computations run
        self.batched_requests = 0     # requests they served

    def add(self, session, sink: Callable, may_continue: Callable[[], bool] = lambda: True) -> None:
        self.entries[session.id] = _Entry(session, session.steps(), sink, may_continue)

    def remove(self, session_id: str) -> None:
        """Stop a session now (its generator closes, which frees its blocks)."""
        entry = self.entries.pop(session_id, None)
        if entry is not None:
            entry.gen.close()

    @property
    def active(self) -> int:
        return len(self.entries)

    def step(self) -> bool:
        """Advance every session that can move, then run all pending forwards. False if nothing moved."""
        moved = False
        for entry in list(self.entries.values()):
            if entry.state == "parked" and entry.may_continue():
                entry.state = "ready"
            if entry.state == "ready":
                self._advance(entry)
                moved = True
        pending = [e for e in self.entries.values() if e.state == "waiting"]
        if pending:
            self._run(pending)
            moved = True
        return moved

    def _advance(self, entry: _Entry) -> None:
        """Run a session's coroutine until it needs a forward, parks at a boundary, or ends."""
        while True:
            try:
                if entry.error is not None:
                    item = entry.gen.throw(entry.error)
                else:
                    item = entry.gen.send(entry.value)
            except StopIteration:
                entry.state = "done"
                self.entries.pop(entry.session.id, None)
                return
            except Exception as exc:  # noqa: BLE001 - a bug in one session ends that session only
                entry.state = "done"
                self.entries.pop(entry.session.id, None)
                entry.sink(Error(f"internal error: {type(exc).__name__}: {exc}"))
                entry.session.close()
                return
            entry.value = entry.error = None
            if isinstance(item, ForwardRequest):
                entry.request, entry.state = item, "waiting"
                return
            if item is ROUND_BOUNDARY:
                if not entry.may_continue():
                    entry.state = "parked"
                    return
                continue
            entry.sink(item)

    def _run(self, pending: list[_Entry]) -> None:
        """Batch requests per model; a request that cannot be batched runs alone."""
        groups: dict[int, list[_Entry]] = defaultdict(list)
        for e in pending:
            r = e.request
            if isinstance(r.runner, PagedRunner) and r.causal and r.inputs_embeds is None:
                groups[id(r.runner.model)].append(e)
            else:
                self._run_alone(e)
        for entries in groups.values():
            if len(entries) == 1:
                self._run_alone(entries[0])
                continue
            prepared, ok = [], []
            for e in entries:
                try:
                    prepared.append(e.request.runner.prepare(e.request.tokens))
                    ok.append(e)
                except Exception as exc:  # noqa: BLE001 - e.g. the pool is full: that session's error
                    self._resume_with(e, error=exc)
            if not ok:
                continue
            t = time.perf_counter()
            try:
                results = forward_batch(ok[0].request.runner.model, prepared, with_hidden=True)
            except Exception as exc:  # noqa: BLE001
                for e in ok:
                    self._resume_with(e, error=exc)
                continue
            seconds = time.perf_counter() - t
            self.batches += 1
            self.batched_requests += len(ok)
            for e, (logits, hidden) in zip(ok, results):
                e.request.runner.finish(seconds, hidden)
                self._resume_with(e, value=logits[-1:] if e.request.last_only else logits)

    def _run_alone(self, e: _Entry) -> None:
        try:
            self._resume_with(e, value=e.request.run())
        except Exception as exc:  # noqa: BLE001
            self._resume_with(e, error=exc)

    @staticmethod
    def _resume_with(e: _Entry, value=None, error=None) -> None:
        e.value, e.error, e.request, e.state = value, error, None, "ready"
