"""Watch mode: any number of read-only viewers follow one presenter's session; fan-out costs no engine work.

A presenter's websocket (`/ws` or `/api/ws`) carries a private `key` (the page gets a fresh one in its
websocket URL; a program may pass `?key=` or get one); its public watch id is a hash of it, so a link to
`/watch/{watch_id}` lets people watch without letting them take over. A presenter that reconnects with
the same key (htmx does, after a network blip) finds its watchers still there.

    Room        one presenter (or none, between reconnects), its watchers, the events of its current run
    Broadcaster one per room and kind (html | json): renders the presenter's items once for all watchers
    Watcher     one viewer's websocket (app/watch/watcher.py): a `Socket`, its `Receiver` and a queue

NOTE (invariants):
- The engine never knows about watchers: the presenter's connection hands each delivered round to its room
  (`publish`), which costs a list append per broadcaster.
- A broadcaster renders at most once per presenter message (at full speed at most 10 a second) and sends
  the same text to every watcher; only snapshots (joining, or catching up) are rendered per need, and a
  snapshot is cached until the next render.
- A watcher that falls behind by more than its queue's bound is not waited for: its queue is replaced by a
  snapshot of the run so far (JSON watchers get a `resync` message first), so memory stays bounded and the
  presenter is never slowed down.
- A snapshot is consistent with the broadcast stream: it shows exactly what the broadcaster has rendered so
  far (the broadcaster's own log), and later broadcasts are deltas from there.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
from typing import Callable

import anyio

from app.protocol import Batch, Notice, RenderContext, View
from app.ws.socket import MIN_INTERVAL_S, Outbox

logger = logging.getLogger(__name__)

WATCH_ID_RE = re.compile(r"[0-9a-f]{16}")
KEY_RE = re.compile(r"[A-Za-z0-9_-]{16,64}")
WATCHER_QUEUE = 256             # messages a watcher may be behind (beyond its snapshot) before it is resynced
LOG_MAX_EVENTS = 6000           # events of the current run kept for snapshots (the page shows fewer)
COLLAPSED = ("kv", "metrics", "draft")    # only the latest of these matters to a snapshot
PUBLISHED_NOTICES = ("state", "reset", "settings_queued", "queued")


def new_key() -> str:
    return secrets.token_urlsafe(18)


def watch_id_for(key: str) -> str:
    return hashlib.sha256(f"watch:{key}".encode()).hexdigest()[:16]


class RunLog:
    """The events of the current run that a late viewer needs, in order (latest kv / metrics / draft only)."""

    def __init__(self):
        self.run_id: int | None = None
        self.events: list = []
        self._latest: dict[str, int] = {}

    def copy(self) -> "RunLog":
        log = RunLog()
        log.run_id, log.events, log._latest = self.run_id, list(self.events), dict(self._latest)
        return log

    def record(self, items) -> None:
        for item in items:
            if isinstance(item, Notice):
                if item.type == "reset":
                    self.run_id, self.events, self._latest = None, [], {}
            elif isinstance(item, Batch):
                for e in item.events:
                    if e.type == "started":
                        self.run_id, self.events, self._latest = item.run_id, [e], {}
                    elif item.run_id == self.run_id:
                        self._append(e)

    def _append(self, e) -> None:
        if e.type in COLLAPSED and e.type in self._latest:
            self.events[self._latest[e.type]] = None
        self._latest[e.type] = len(self.events)
        self.events.append(e)
        if len(self.events) > LOG_MAX_EVENTS:       # keep `started` and the newer half
            kept = [self.events[0]] + [e for e in self.events[-(LOG_MAX_EVENTS // 2):] if e is not None]
            self.events, self._latest = [], {}
            for e in kept:
                if e.type in COLLAPSED:
                    self._latest[e.type] = len(self.events)
                self.events.append(e)

    def batches(self) -> list[Batch]:
        """The log as the items a fresh view renders: the run, then its end on its own (so that the view has
        drawn the KV pools before it redraws them from the engine's current state, as after `done`)."""
        if self.run_id is None:
            return []
        events = [e for e in self.events if e is not None]
        if events and events[-1].type in ("done", "error"):
            return [Batch(self.run_id, events[:-1]), Batch(self.run_id, events[-1:])]
        return [Batch(self.run_id, events)]


class Room:
    """One presenter and its watchers. Views render for the room with its presenter's context."""

    def __init__(self, rooms: "Rooms", watch_id: str):
        self.rooms, self.watch_id = rooms, watch_id
        self.presenter = None
        self.current_run = None          # the presenter's latest run (kept when the presenter leaves)
        self.watchers: set = set()
        self.broadcasters: dict[str, Broadcaster] = {}
        self.log = RunLog()

    @property
    def speed(self):
        return self.presenter.pace.speed if self.presenter else None

    def context(self) -> RenderContext:
        """What the room's views know: the presenter's latest run, and its state while it is connected."""
        p = self.presenter
        return RenderContext(self.current_run.run_id if self.current_run else None, bool(p and p.pace.paused),
                             p.state if p else "idle", p.pace.speed if p else None, self.watch_id)

    def run_started(self, run) -> None:
        self.current_run = run

    def publish(self, item) -> None:
        """An item of the presenter's stream (a round's batch, or a notice watchers should see)."""
        self.log.record((item,))
        for b in self.broadcasters.values():
            b.outbox.put(item)


class Broadcaster:
    def __init__(self, room: Room, kind: str):
        self.room, self.kind = room, kind
        self.view = room.rooms.make_view(kind)
        self.outbox = Outbox()
        self.watchers: set = set()
        self.log = room.log.copy()
        self.version = 0
        self.renders = 0
        self._snapshot: tuple[int, list[str]] | None = None
        self.view.render(self.log.batches(), room.context())     # the view's state is now that of the log
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        self.task.cancel()

    def snapshot(self) -> list[str]:
        """The run so far as a fresh page (or program) needs it, rendered once per broadcast."""
        if self._snapshot is None or self._snapshot[0] != self.version:
            view = self.room.rooms.make_view(self.kind)
            items = self.log.batches()
            if self.kind == "html":
                items.insert(0, Notice("hello", {}))     # the page's connection indicator
            room = self.room
            if room.presenter is not None and room.current_run is not None and not room.current_run.ended:
                p = room.presenter
                items.append(Notice("state", {"state": p.state, "round": room.current_run.round, "speed": p.pace.speed,
                                              "paused": p.pace.paused}))
            try:
                messages = view.render(items, room.context())
            except Exception:  # noqa: BLE001
                logger.exception("rendering a snapshot failed")
                messages = []
            self._snapshot = (self.version, messages)
        return self._snapshot[1]

    async def _run(self) -> None:
        try:
            while True:
                items = await self.outbox.take_all()
                try:
                    messages = self.view.render(items, self.room.context())
                except Exception:  # noqa: BLE001 - a rendering bug must not take the room down
                    logger.exception("rendering %d items for watchers failed", len(items))
                    messages = []
                self.log.record(items)
                self.version += 1
                self.renders += 1
                if messages:
                    for w in list(self.watchers):
                        w.push(messages, self)
                run = self.room.current_run
                if self.room.speed is None and run is not None and not run.ended:
                    await anyio.sleep(MIN_INTERVAL_S)     # full speed: coalesce, at most 10 messages a second
                else:
                    await anyio.sleep(0)
        except asyncio.CancelledError:
            pass


class Rooms:
    """Every room of the process. `make_view(kind)` makes a fresh view of a kind (html | json) for a room's
    broadcaster (the composition root, app/state.py, hands it in)."""

    def __init__(self, make_view: Callable[[str], View]):
        self.make_view = make_view
        self.rooms: dict[str, Room] = {}
        self.watchers = 0                  # open watcher websockets (app/watch/watcher.py)

    def _room(self, watch_id: str) -> Room:
        room = self.rooms.get(watch_id)
        if room is None:
            room = self.rooms[watch_id] = Room(self, watch_id)
        return room

    def join_presenter(self, conn, key: str) -> Room:
        watch_id = watch_id_for(key)
        room = self._room(watch_id)
        old, room.presenter = room.presenter, conn
        conn.room, conn.watch_id = room, watch_id
        if old is not None and old is not conn:
            # the same key again (a reconnect before the old socket was noticed dead, a duplicated tab)
            old.room = None
            old.socket.close_soon(1000, "another connection took over this session")
        if room.watchers:
            room.publish(Notice("note", {"kind": "presenter", "text": "the presenter is connected"}))
        return room

    def leave_presenter(self, conn) -> None:
        room = conn.room
        conn.room = None
        if room is None or room.presenter is not conn:
            return
        room.presenter = None
        if room.watchers:
            room.publish(Notice("note", {"kind": "presenter", "text": "the presenter has left; this page shows "
                                                                      "their next run when they come back"}))
        self._drop_if_empty(room)

    def join_watcher(self, watcher, watch_id: str) -> Room:
        room = self._room(watch_id)
        b = room.broadcasters.get(watcher.kind)
        if b is None:
            b = room.broadcasters[watcher.kind] = Broadcaster(room, watcher.kind)
        room.watchers.add(watcher)
        b.watchers.add(watcher)
        watcher.room, watcher.broadcaster = room, b
        watcher.push_snapshot()
        return room

    def leave_watcher(self, watcher) -> None:
        room, b = watcher.room, watcher.broadcaster
        if room is None:
            return
        room.watchers.discard(watcher)
        b.watchers.discard(watcher)
        if not b.watchers:
            b.stop()
            room.broadcasters.pop(b.kind, None)
        self._drop_if_empty(room)

    def _drop_if_empty(self, room: Room) -> None:
        if room.presenter is None and not room.watchers:
            for b in room.broadcasters.values():
                b.stop()
            self.rooms.pop(room.watch_id, None)
