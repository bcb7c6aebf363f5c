"""One generation of a presenter's connection, on our engine or on an external one (app/ws/external.py)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import anyio

OUTBOX_MAX_BATCHES = 32         # rounds waiting to be sent before the engine holds the session for its client
_run_ids = itertools.count(1)   # process-wide: a watcher follows runs across its presenter's reconnects


def next_run_id() -> int:
    return next(_run_ids)


@dataclass(eq=False)
class Run:
    """One generation of this connection."""
    run_id: int
    session: Any                  # GenerationSession, or ExternalSession (app/ws/external.py)
    link: Any = None              # SessionLink, or ExternalLink
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    finished: anyio.Event = field(default_factory=anyio.Event)     # blocks freed, slot given back
    ended_event: anyio.Event = field(default_factory=anyio.Event)  # done or error arrived
    queued: bool = True           # waiting for a slot
    position: int = 0
    stopping: bool = False
    ended: bool = False           # done or error was produced
    round: int = 0
    last_progress_at: float = 0.0
    sent_settings: dict = field(default_factory=dict)
