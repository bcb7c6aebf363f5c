"""Recorded runs: the events of a generation as the page showed them, for export, the token inspector and replay.

A `Recording` is one run's engine events in order (the objects of engine/serving/events.py; their JSON form is
`to_dict()`), plus the KV pools as the page drew them after the run had freed its blocks. Exported, it is
a JSON file (`to_json`) that `from_json` reads back; app/views/replay.py turns it into the very messages the page
received, one per round, without an engine.

NOTE (invariants):
- The store keeps the most recent recordings within a budget of events (memory is bounded whatever the
  number of viewers); a recording never holds more than MAX_EVENTS events (it says so when cut).
- Keys are not guessable: random for live runs, a hash of the content for uploaded files. Only a page that
  showed the run (or someone who has the file) can read a recording back.
- One recording per run: the first view that sees a run's `started` records it (`claim`); every other view
  of the same run (a room's broadcaster, a late watcher's snapshot) only refers to it, by its key.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict

from engine.serving.events import Event, event_from_dict

FORMAT = "decoding-playground/recording"
VERSION = 1
MAX_EVENTS = 40_000             # a 4,096-token run is about 17,000 events
STORE_EVENTS = 400_000          # all kept recordings together
MAX_RECORDINGS = 64


class RecordingError(ValueError):
    """A file that is not a recording this version can replay."""


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

    def token(self, round_: int, position: int, status: str) -> Event | None:
        return self._tokens.get((round_, position, status))

    def draft(self, round_: int) -> Event | None:
        return self._drafts.get(round_)

    def last(self, type_: str) -> Event | None:
        for e in reversed(self.events):
            if e.type == type_:
                return e
        return None

    # --- the file ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "prompt": self.prompt,
                "settings": self.settings, "complete": self.complete, "truncated": self.truncated,
                "events": [e.to_dict() for e in list(self.events)],       # (a copy: the run may go on meanwhile)
                "kv_after": [{"key": list(k), "pool": p} for k, p in list(self.snapshots.items())]}

    @classmethod
    def from_json(cls, data, name: str | None = None) -> "Recording":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise RecordingError(f"not a recording of this playground (expected \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise RecordingError(f"recording version {data.get('version')!r}; this page replays version {VERSION}")
        events = data.get("events")
        if not isinstance(events, list) or not events:
            raise RecordingError("the recording has no events")
        if len(events) > MAX_EVENTS:
            raise RecordingError(f"{len(events):,} events: at most {MAX_EVENTS:,}")
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        rec = cls(hashlib.sha256(canonical).hexdigest()[:32], data.get("prompt"), "file", name,
                  data.get("created") if isinstance(data.get("created"), (int, float)) else None)
        for i, d in enumerate(events):
            try:
                rec.add(event_from_dict(d))
            except ValueError as e:
                raise RecordingError(f"event {i}: {e}") from None
        if rec.started is None:
            raise RecordingError("the first event must be 'started'")
        for item in data.get("kv_after") or []:
            if isinstance(item, dict) and isinstance(item.get("key"), list) and isinstance(item.get("pool"), dict):
                rec.snapshots[tuple(item["key"])] = item["pool"]
        rec.truncated = bool(data.get("truncated"))
        return rec


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
