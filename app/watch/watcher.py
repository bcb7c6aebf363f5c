"""A watcher: one read-only viewer's websocket in a room (app/watch/rooms.py)."""
from __future__ import annotations

import json
import logging
from collections import deque

import anyio
from starlette.websockets import WebSocketDisconnect

from app.config import AppConfig
from app.logs import log_event
from app.protocol import Notice, RenderContext
from app.watch.rooms import WATCHER_QUEUE, Broadcaster, Room, Rooms
from app.ws.socket import Receiver, Socket

logger = logging.getLogger(__name__)


class Watcher:
    """A read-only viewer: the page's acknowledgements are read and ignored, anything else is answered with
    an error; the messages it gets are its broadcaster's."""

    def __init__(self, websocket, config: AppConfig, rooms: Rooms, kind: str, watch_id: str):
        self.rooms, self.kind, self.watch_id = rooms, kind, watch_id
        self.socket = Socket(websocket)
        self.receiver = Receiver(self.socket, config, self.on_text, self.error, unsent=self.unsent)
        self.room: Room | None = None
        self.broadcaster: Broadcaster | None = None
        self.queue: deque[str] = deque()
        self.limit = WATCHER_QUEUE
        self.resyncs = 0
        self._ready = anyio.Event()

    async def serve(self) -> None:
        rooms = self.rooms
        rooms.watchers += 1
        try:
            if self.kind == "json":
                room = rooms.rooms.get(self.watch_id)
                self.queue.append(json.dumps({"type": "watching", "watch_id": self.watch_id,
                                              "presenter": bool(room and room.presenter)}))
            rooms.join_watcher(self, self.watch_id)
            log_event(logger, "watcher_joined", watch_id=self.watch_id, kind=self.kind,
                      watchers=len(self.room.watchers))
            await self.socket.serve(self.receiver.run, self._sender)
        finally:
            rooms.watchers -= 1
            rooms.leave_watcher(self)

    def unsent(self) -> int:
        return len(self.queue)

    def push_snapshot(self) -> None:
        snapshot = self.broadcaster.snapshot()
        self.queue.extend(snapshot)
        self.limit = WATCHER_QUEUE + len(snapshot)
        self._ready.set()

    def push(self, messages: list[str], broadcaster: Broadcaster) -> None:
        if len(self.queue) + len(messages) > self.limit:
            self.queue.clear()                 # too far behind: start again from the run so far
            self.resyncs += 1
            if self.kind == "json":
                self.queue.append(json.dumps({"type": "resync", "watch_id": self.watch_id}))
            self.push_snapshot()
            return
        self.queue.extend(messages)
        self._ready.set()

    async def _sender(self) -> None:
        try:
            while True:
                while not self.queue:
                    if self._ready.is_set():
                        self._ready = anyio.Event()
                    await self._ready.wait()
                while self.queue:
                    await self.socket.send_text(self.queue.popleft())
                await anyio.sleep(0)
        except (WebSocketDisconnect, OSError, RuntimeError):
            self.socket.end()

    async def on_text(self, text: str) -> None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and data.keys() == {"ack"}:
            return
        self.error("watch mode is read-only: this page follows another person's session")

    def error(self, message: str, setting: str | None = None) -> None:
        if self.kind == "json":
            self.queue.append(json.dumps({"type": "error", "message": message, "setting": setting}))
        else:
            view = self.rooms.make_view("html")
            context = self.room.context() if self.room is not None else RenderContext()
            self.queue.extend(view.render([Notice("error", {"message": message})], context))
        self._ready.set()
