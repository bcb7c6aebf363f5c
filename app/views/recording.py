"""Recorded runs: the events of a generation as the page showed them, for export, the token inspector and replay.

A `Recording` is one run's engine events in order (the objects of engine/serving/events.py; their JSON form is
`to_dict()`), plus the KV pools as the page drew them after the run had freed its blocks. Exported, it is
a JSON file (`to_json`) that app/views/recording_file.py reads back; app/views/replay.py turns it into the very
messages the page received, one per round, without an engine.

NOTE (invariants):
- The store keeps the most recent recordings within a budget of events (memory is bounded whatever the
  number of viewers); a recording never holds more than MAX_EVENTS events (it says so when cut).
- Keys are not guessable: random for live runs, a hash of the file for uploaded ones. Only a page that
  showed the run (or someone who has the file) can read a recording back.
- One recording per run: the first view that sees a run's `started` records it (`claim`); every other view
  of the same run (a room's broadcaster, a late watcher's snapshot) only refers to it, by its key.
"""
from __future__ import annotations

import copy
import pickle
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from app.views.json import dumps, event_dict
from app.views.recording_file import FORMAT, MAX_EVENTS, VERSION, RecordingError, read_recording, rebuilt_recording
from engine.serving.events import Event

__all__ = ["FORMAT", "MAX_EVENTS", "RECORDINGS", "VERSION", "Recording", "RecordingError", "RecordingStore"]
STORE_EVENTS = 400_000          # all kept recordings together
MAX_RECORDINGS = 64


class Recording:
    def __init__(self, key: str, prompt: str | None = None, source: str = "live", name: str | None = None,
                 created: float | None = None):
        self.key, self.prompt, self.source, self.name = key, prompt, source, name
        self.created = time.time() if created is None else created
        self.events: list[Event] = []
        self.snapshots: dict[tuple, dict] = {}    # pool key -> the pool as drawn after the run freed its blocks
        self.complete = False                     # ended with done or error
        self.truncated = False
        self._tokens: dict[tuple, Event] = {}
        self._drafts: dict[int, Event] = {}

    def add(self, event: Event) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.truncated = True
            return
        self.events.append(event)
        if event.type == "token":
            self._tokens[(event.round, event.position, event.status)] = event
            if getattr(event, "node", None) is not None:      # a token tree's: several rejected at one position
                self._tokens[(event.round, "node", event.node)] = event
        elif event.type == "draft":
            self._drafts[event.round] = event
        elif event.type in ("done", "error"):
            self.complete = True

    # --- what the views read --------------------------------------------------------------------
    @property
    def started(self) -> Event | None:
        return self.events[0] if self.events and self.events[0].type == "started" else None

    @property
    def settings(self) -> dict:
        return self.started.settings if self.started else {}

    @property
    def num_rounds(self) -> int:
        """Rounds after the prefill (each reported by a `round` event)."""
        return sum(e.type == "round" for e in self.events)

    def token(self, round_: int, position: int, status: str, node: int | None = None) -> Event | None:
        """The token event at this round, position and status; in a token tree's round, `node` tells apart the
        children of the path's end that were all rejected at one position."""
        if node is None:
            return self._tokens.get((round_, position, status))
        e = self._tokens.get((round_, "node", node))
        return e if e is not None and (e.position, e.status) == (position, status) else None

    def draft(self, round_: int) -> Event | None:
        return self._drafts.get(round_)

    def last(self, type_: str) -> Event | None:
        for e in reversed(self.events):
            if e.type == type_:
                return e
        return None

    # --- the file ---------------------------------------------------------------------------------
    def _head(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "prompt": self.prompt,
                "settings": self.settings, "complete": self.complete, "truncated": self.truncated}

    def _kv_after(self) -> list:
        return [{"key": list(k), "pool": p} for k, p in list(self.snapshots.items())]

    def to_json(self) -> dict:
        return {**self._head(), "events": [e.to_dict() for e in list(self.events)],   # (a copy: the run may go on)
                "kv_after": self._kv_after()}

    def to_json_bytes(self) -> bytes:
        """`to_json()` as the file's bytes, written an event at a time: one call over a long run's events would
        hold the GIL, which the event loop needs, for a tenth of a second."""
        events = [dumps(event_dict(e)).encode() for e in list(self.events)]
        return b"".join([dumps(self._head())[:-1].encode(), b',"events":[', b",".join(events), b'],"kv_after":',
                         dumps(self._kv_after()).encode(), b"}"])

    @classmethod
    def read(cls, body: bytes | Iterable[bytes], name: str | None = None) -> "Recording":
        """A recording file's bytes, read and checked field by field (app/views/recording_file.py)."""
        return read_recording(cls, body, name)

    # --- between processes (an upload is read in a process of its own) -------------------------------------
    def to_parts(self, events_per_part: int = 32) -> list[bytes]:
        """The recording pickled in parts: the recording without its events, then its events a few at a time, so
        that the process that makes it again (`from_parts`) holds the GIL for one short part at a time."""
        shell = copy.copy(self)
        shell.events, shell._tokens, shell._drafts = [], {}, {}
        return [pickle.dumps(shell)] + [pickle.dumps(self.events[i:i + events_per_part])
                                        for i in range(0, len(self.events), events_per_part)]

    @classmethod
    def from_parts(cls, parts: Iterable[bytes]) -> "Recording":
        """`to_parts`' recording made again (only from a process of ours: pickle runs what it is given)."""
        return rebuilt_recording(parts)

    @classmethod
    def from_json(cls, data, name: str | None = None) -> "Recording":
        """A recording from its JSON form, already parsed (tests, tools): read as a file is."""
        return cls.read(dumps(data).encode(), name)


class RecordingStore:
    """The recent recordings, most recently used last. Thread-safe (routes run in worker threads)."""

    def __init__(self, max_events: int = STORE_EVENTS, max_recordings: int = MAX_RECORDINGS):
        self.max_events, self.max_recordings = max_events, max_recordings
        self._items: OrderedDict[str, Recording] = OrderedDict()
        self._by_session: dict[str, str] = {}
        self._lock = threading.Lock()

    def claim(self, session_id: str, prompt: str | None = None) -> tuple[Recording, bool]:
        """The recording of a run (by its session id), and whether the caller is the one to record it."""
        with self._lock:
            key = self._by_session.get(session_id)
            rec = self._items.get(key) if key else None
            if rec is not None:
                return rec, False
        rec = Recording(secrets.token_hex(16), prompt)
        self.put(rec)
        with self._lock:
            self._by_session[session_id] = rec.key
        return rec, True

    def put(self, rec: Recording) -> Recording:
        with self._lock:
            self._items[rec.key] = rec
            self._items.move_to_end(rec.key)
            total = sum(len(r.events) for r in self._items.values())
            while len(self._items) > 1 and (len(self._items) > self.max_recordings or total > self.max_events):
                _, old = self._items.popitem(last=False)
                total -= len(old.events)
            if len(self._by_session) > len(self._items):
                live = set(self._items)
                self._by_session = {s: k for s, k in self._by_session.items() if k in live}
        return rec

    def get(self, key: str) -> Recording | None:
        with self._lock:
            rec = self._items.get(key)
            if rec is not None:
                self._items.move_to_end(key)
            return rec


RECORDINGS = RecordingStore()
