"""A scheduler for many sessions at once, with continuous batching.

Each session runs as a coroutine (`GenerationSession.steps()`): it yields events, forward requests and
round boundaries. The scheduler advances every session to its next forward request, then runs the
requests of the same model as one batched computation (`engine.model.llama.forward_batch`): one matrix
product per layer for all sessions' rows, attention per sequence through its own block table.

NOTE (invariants):
- Single-threaded: `step()` and `add()`/`remove()` are called from one engine thread only; sinks and
  `may_continue` callbacks must be cheap and thread-safe on their side (they run in that thread).
- A session waits at a round boundary until its `may_continue()` says go: pacing (pause, step mode,
  slow motion) holds a session without holding the others.
- A forward that raises (e.g. the pool is full) is thrown back into its own session only.

Chunked prefill: a step computes about `max_num_batched_tokens` tokens (vLLM's budget) or, without one, about
`chunk_seconds` of work by each model's own measured prefill speed. A budget in tokens suits one model; one engine
thread serves models 1,000x apart in cost per token, so by default a chunk is sized in time: a tiny model's prompt
runs whole, SmolLM2's in chunks of some tens of tokens, and a bystander waits at most about one chunk.
Decode steps, verifications and requests that fit run whole first; a longer prefill (a request of more
tokens that needs only its last logits) gets the rest of the budget, at least `MIN_CHUNK` tokens, and
goes on in the next steps, its session waiting meanwhile with a `PrefillProgress` event after each chunk
and one when its last part has run (num_computed = num_tokens: nothing else says that a draft model's
catch-up, or a re-prefill after a settings change, is over).
So a 2,000-token prompt no longer holds every other session for the whole of its prefill: theirs run
between its chunks. Of several long prefills the one with the fewest tokens left goes first. The session sees
one forward and its logits, as if it had run whole (the chunks write the same K/V; only float32 rounding
of products over other row counts differs). A runner without a cache recomputes everything each call:
its requests are never chunked.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from ..kv.runner import ROUND_BOUNDARY, ForwardRequest, PagedRunner, clock_for
from ..model.llama import forward_batch
from .events import Error, PrefillProgress

logger = logging.getLogger(__name__)


def served_steps(session):
    """`session.steps()` as a server serves it: a round boundary right after `started`, so that a session started
    paused waits before its prefill, and an unexpected exception (an engine bug) ends this session with an
    `error` event instead of escaping into the scheduler (and every other session's step)."""
    gen = session.steps()
    try:
        yield next(gen)                       # started
        yield ROUND_BOUNDARY
        yield from gen
    except Exception as e:  # noqa: BLE001
        logger.exception("generation %s failed", session.id)
        yield Error(f"internal error: {type(e).__name__}: {e}")
    finally:
        gen.close()


class ServedSession:
    """What the scheduler holds for a session: its id and its served steps."""
    __slots__ = ("id", "session")

    def __init__(self, session):
        self.id, self.session = session.id, session

    def steps(self):
        return served_steps(self.session)


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
    chunked: bool = False           # its pending request has run in chunks: its end is reported too


# A prefill chunk's time when no token budget is set: a bystander's first token waits about one (`bench faults`)
CHUNK_SECONDS = 0.25
MIN_CHUNK = 8                 # a long prefill advances at least this much per step, however busy the others


class Scheduler:
    def __init__(self, max_num_batched_tokens: int | None = None, chunk_seconds: float | None = None,
                 before_chunks: Callable[[], None] = lambda: None):
        self.entries: dict[str, _Entry] = {}
        self.max_num_batched_tokens = max_num_batched_tokens     # a step's tokens; None: by time
        self.chunk_seconds = None if max_num_batched_tokens is not None else chunk_seconds   # both None: whole
        self._largest: dict[int, tuple[int, float]] = {}   # id(model) -> (rows, wall s) of its largest prefill forward
        self.before_chunks = before_chunks     # called between a step's whole requests and its chunks
        self.batches = 0              # batched computations run
        self.batched_requests = 0     # requests they served
        self.chunks = 0               # prefill chunks run (all but the last of each chunked prefill)

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

    def _budget(self, r: ForwardRequest) -> int | None:
        """The tokens a step computes beside this request's model: the token budget, or about `chunk_seconds` of
        the model's prefill (MIN_CHUNK before it has been measured); None: prefills run whole.

        A forward's time grows less than in proportion to its rows (each call streams every weight, and on some
        CPUs packs it, whatever the rows), so the rows scaled from the model's largest prefill forward cost at
        most about `chunk_seconds` when they are more than that forward's: the chunks grow to the size that
        fills the time, and a tiny model's prompts soon run whole."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.chunk_seconds is None:
            return None
        rows, seconds = self._largest.get(id(r.runner.model), (0, 0.0))
        return max(MIN_CHUNK, int(rows * self.chunk_seconds / seconds)) if seconds > 0 else MIN_CHUNK

    def _chunkable(self, r: ForwardRequest) -> bool:
        if not (r.last_only and r.causal and r.inputs_embeds is None and isinstance(r.runner, PagedRunner)):
            return False
        budget = self._budget(r)
        return budget is not None and len(r.tokens) > budget

    def _plan(self, pending: list[_Entry]) -> list[tuple[_Entry, int | None]]:
        """What each pending request computes this step: (entry, None) whole, (entry, n) its next n tokens
        (a chunk); requests left out wait for the next step."""
        for e in pending:
            if self._chunkable(e.request):            # the prefix cache serves what it holds of the whole
                e.request.tokens = e.request.runner.match_prefix(e.request.tokens)
        whole = [e for e in pending if not self._chunkable(e.request)]     # after the cache: it may be short now
        plan: list[tuple[_Entry, int | None]] = [(e, None) for e in whole]
        used = sum(len(e.request.tokens) for e in whole)
        # the shortest first: a short prompt is not kept waiting behind a long one (which goes on meanwhile
        # whenever there is room, and as the first of them at least MIN_CHUNK tokens a step)
        chunkable = sorted((e for e in pending if self._chunkable(e.request)), key=lambda e: len(e.request.tokens))
        for i, e in enumerate(chunkable):
            room = self._budget(e.request) - used
            if i and room < MIN_CHUNK:
                break
            n = max(room, MIN_CHUNK)
            plan.append((e, n if n < len(e.request.tokens) else None))
            used += n
        return plan

    def _run(self, pending: list[_Entry]) -> None:
        """The whole requests first, then the chunks. Between them the sessions whose forwards are done are
        advanced to their next one, so that what they produced (a first token, say) can be sent on
        (`before_chunks`) without waiting for the chunks."""
        plan = self._plan(pending)
        whole = [(e, chunk) for e, chunk in plan if chunk is None]
        self._run_batched(whole)
        chunks = [(e, chunk) for e, chunk in plan if chunk is not None]
        if chunks:
            for e, _ in whole:
                if e.state == "ready" and e.session.id in self.entries:
                    self._advance(e)
            self.before_chunks()
            self._run_batched(chunks)

    def _run_batched(self, planned: list[tuple[_Entry, int | None]]) -> None:
        """Batch requests per model; a request that cannot be batched runs alone."""
        groups: dict[int, list[tuple[_Entry, int | None]]] = defaultdict(list)
        for e, chunk in planned:
            r = e.request
            if isinstance(r.runner, PagedRunner) and r.causal and r.inputs_embeds is None:
                groups[id(r.runner.model)].append((e, chunk))
            else:
                self._run_alone(e)
        for group in groups.values():
            if len(group) == 1 and group[0][1] is None:
                self._run_alone(group[0][0])
                continue
            prepared, ok = [], []
            clock = clock_for(group[0][0].request.runner.model)
            for e, chunk in group:
                try:
                    t = clock()
                    prepared.append(e.request.runner.prepare(e.request.tokens[:chunk]))
                    e.request.seconds += clock() - t        # its slots: its own work
                    ok.append((e, chunk))
                except Exception as exc:  # noqa: BLE001 - e.g. the pool is full: that session's error
                    self._resume_with(e, error=exc)
            if not ok:
                continue
            t, wall = clock(), time.perf_counter()
            try:
                results = forward_batch(ok[0][0].request.runner.model, prepared,
                                        [chunk is not None or e.request.last_only for e, chunk in ok],
                                        with_hidden=True)
            except Exception as exc:  # noqa: BLE001
                for e, _ in ok:
                    self._resume_with(e, error=exc)
                continue
            seconds = clock() - t
            self._note_prefill_speed(ok, prepared, time.perf_counter() - wall)
            self.batches += 1
            self.batched_requests += len(ok)
            for (e, chunk), (logits, hidden) in zip(ok, results):
                r = e.request
                r.seconds += seconds       # each session of a batch is charged the whole batched forward
                r.runner.finish(seconds, hidden, chunk=chunk is not None)
                if chunk is None:
                    self._finish_chunked(e, seconds)
                    self._resume_with(e, value=logits[-1:] if r.last_only else logits)
                else:                      # a chunk: the rest waits for the next step
                    self.chunks += 1
                    e.chunked = True
                    r.tokens = r.tokens[chunk:]
                    e.sink(PrefillProgress(r.role, r.num_tokens - len(r.tokens), r.num_tokens, seconds * 1e3))

    def _note_prefill_speed(self, ok: list[tuple[_Entry, int | None]], prepared: list, wall_s: float) -> None:
        """The model's largest prefill forward (one that held a chunk or a prompt of at least MIN_CHUNK rows),
        kept until one as large or larger replaces it (as the machine's load changes): what chunks are sized by."""
        rows = sum(len(p[0]) for p in prepared)
        key = id(ok[0][0].request.runner.model)
        if any(len(p[0]) >= MIN_CHUNK for p in prepared) and rows >= self._largest.get(key, (0, 0.0))[0]:
            self._largest[key] = (rows, wall_s)

    def _run_alone(self, e: _Entry) -> None:
        before = e.request.seconds
        try:
            value = e.request.run()
        except Exception as exc:  # noqa: BLE001
            self._resume_with(e, error=exc)
            return
        self._finish_chunked(e, e.request.seconds - before)
        self._resume_with(e, value=value)

    @staticmethod
    def _finish_chunked(e: _Entry, seconds: float) -> None:
        """The last part of a prefill that ran in chunks is done: say so (`num_computed` = `num_tokens`)."""
        if e.chunked:
            e.chunked = False
            e.sink(PrefillProgress(e.request.role, e.request.num_tokens, e.request.num_tokens, seconds * 1e3))

    @staticmethod
    def _resume_with(e: _Entry, value=None, error=None) -> None:
        e.value, e.error, e.request, e.state = value, error, None, "ready"
        if error is not None:
            e.chunked = False
