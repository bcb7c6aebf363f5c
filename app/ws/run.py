"""One generation of a presenter's connection, on our engine or on an external one (app/ws/external.py), and the
pace its client asked for."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import anyio

OUTBOX_MAX_BATCHES = 32         # rounds waiting to be sent before the engine holds the session for its client
# For a page at full speed the engine thread posts its rounds to the event loop together, at most this late:
# each post wakes the event loop, which then takes the GIL from the engine thread (docs/benchmarks.md,
# `bench page`).
PAGE_DELIVERY_DELAY_S = 0.02
_run_ids = itertools.count(1)   # process-wide: a watcher follows runs across its presenter's reconnects


def next_run_id() -> int:
    return next(_run_ids)


@dataclass(eq=False)
class ClientPace:
    """How the client wants its runs to go: paused (and how many steps it has granted) and at what speed.

    The connection writes it (on the event loop only), across its runs; a run's gate reads it at every round
    boundary (`Pacing` in app/ws/engine_thread.py, `ExternalLink` in app/ws/external.py), and the sender reads
    whether a page is at full speed (app/ws/sender.py).
    """
    acks: bool                    # the view's page acknowledges the messages it has rendered (the htmx page)
    speed: float | None = None    # rounds per second; None: full speed
    paused: bool = False
    steps_granted: int = 0        # step commands so far

    @property
    def page_at_full_speed(self) -> bool:
        return self.acks and self.speed is None

    @property
    def delivery_delay_s(self) -> float:
        """How long the engine thread may hold a round to post it with later ones."""
        return PAGE_DELIVERY_DELAY_S if self.page_at_full_speed else 0.0


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
