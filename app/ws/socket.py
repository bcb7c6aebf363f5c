"""A websocket of the app (`Socket`), the receiving half every one of them shares (`Receiver`), and the outbox a
sender takes from.

A presenter's connection (app/ws/connection.py) and a watcher (app/watch/watcher.py) are each made of these:

    socket = Socket(websocket, release=...)           # sends, closes once, owns the tasks that serve it
    receiver = Receiver(socket, config, on_text=..., error=..., unsent=...)
    await socket.serve(receiver.run, sender.run, ...)  # until the client goes or the server closes

The receiver enforces the message size, the message rate and UTF-8, answers bad input with an error item (its
owner's `error`), and closes the socket only for policy violations (a flood of messages, a client that never
reads).
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Awaitable, Callable

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.config import MAX_MESSAGE_BYTES, AppConfig
from app.logs import log_event
from app.security import TokenBucket

logger = logging.getLogger(__name__)

MAX_UNSENT_ITEMS = 512          # a client that sends but never reads is closed (1008) before it costs memory
FLOOD_CLOSE_AFTER = 2000        # messages over the rate limit without a pause: the connection is closed (1008)
RATE_ERROR_EVERY_S = 1.0        # at most one "rate limit" error a second
CLOSE_WAIT_S = 5.0              # at most this long for a close the server decided (the transport gives up sooner)
# At full speed a sender coalesces: what arrives while it waits goes out as one message, at most one every
# MIN_INTERVAL_S for a page while rounds come fast (at most 10 a second: each costs the browser a fixed amount
# of work, taken from the engine when no core is free; app/ws/sender.py). Watchers' broadcasters (app/watch/)
# keep the 10 a second.
MIN_INTERVAL_S = 1 / 10


class Outbox:
    """Items for the sender, in order. Never waits: the engine thread's gate bounds the rounds in it."""

    def __init__(self):
        self.items: deque = deque()
        self._ready = anyio.Event()

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item) -> None:
        self.items.append(item)
        self._ready.set()

    put_notice = put_batch = put

    async def take_all(self) -> list:
        while not self.items:
            if self._ready.is_set():
                self._ready = anyio.Event()
            await self._ready.wait()
        return self.take_now()

    def take_now(self) -> list:
        items = list(self.items)
        self.items.clear()
        return items


async def _nothing_to_release() -> None:
    pass


class Socket:
    """One websocket and the tasks that serve it (its receiver, its sender, ...).

    NOTE: `tasks` is the running task group while `serve` runs, None before and after: nothing may be started
    in it then. A close happens once (`closed` holds its code); it first awaits `release` (what the connection
    holds goes at once, not once the peer has been dealt with), then closes the websocket within bounded time,
    then ends every task.
    """

    def __init__(self, websocket: WebSocket, release: Callable[[], Awaitable[None]] = _nothing_to_release):
        self.ws = websocket
        self.release = release
        self.closed: int | None = None
        self.tasks: anyio.abc.TaskGroup | None = None

    async def serve(self, *tasks: Callable[[], Awaitable[None]]) -> None:
        """Run `tasks` together until they end, or until the client goes or the socket is closed."""
        try:
            async with anyio.create_task_group() as tg:
                self.tasks = tg
                for task in tasks:
                    tg.start_soon(task)
        finally:
            self.tasks = None

    def end(self) -> None:
        """End every task serving this socket (the client has gone, or we have closed)."""
        if self.tasks is not None:
            self.tasks.cancel_scope.cancel()

    async def send_text(self, text: str) -> None:
        try:
            await self.ws.send_text(text)
        except UnicodeEncodeError:   # a lone surrogate (JSON's "\\ud800") cannot be UTF-8 on the wire
            await self.ws.send_text(text.encode("utf-8", "replace").decode("utf-8"))

    async def close(self, code: int, reason: str) -> None:
        """Close the websocket (if it is still open) and end every task of this connection."""
        if self.closed is None:
            self.closed = code
            log_event(logger, "ws_closed_by_server", code=code, reason=reason)
            await self.release()
            # bounded: the transport gives up on a peer that does not read (app/ws/transport.py)
            with anyio.move_on_after(CLOSE_WAIT_S, shield=True):
                try:
                    await self.ws.close(code=code, reason=reason[:120])
                except (RuntimeError, OSError, WebSocketDisconnect):
                    pass
        self.end()

    def close_soon(self, code: int, reason: str) -> None:
        """Close from outside its tasks (another connection took over): in its own task group, if that still
        runs (if not, its tasks have ended and it is on its way out already)."""
        if self.tasks is not None:
            self.tasks.start_soon(self.close, code, reason)


class Receiver:
    """Reads every message of a socket at once: limits first, then `on_text`.

    NOTE: a message over MAX_MESSAGE_BYTES, binary that is not UTF-8, or a message over the rate limit is
    answered with `error` and otherwise ignored (the rate error at most once a second). A client that goes
    over the rate FLOOD_CLOSE_AFTER times without once letting its bucket fill up again is closed (1008), and
    so is one that sends while more than MAX_UNSENT_ITEMS items wait for it (`unsent()`).
    """

    def __init__(self, socket: Socket, config: AppConfig, on_text: Callable[[str], Awaitable[None]],
                 error: Callable[[str], None], unsent: Callable[[], int] = lambda: 0):
        self.socket, self.on_text, self.error, self.unsent = socket, on_text, error, unsent
        self.bucket = TokenBucket(config.messages_per_s, config.message_burst)
        self.last_message_at = anyio.current_time()
        self._dropped = 0
        self._last_rate_error = -1e9

    async def run(self) -> None:
        ws = self.socket.ws
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                self.socket.end()
                return
            text = message.get("text")
            if text is None and message.get("bytes") is not None:
                try:
                    text = message["bytes"].decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                    if self._admit():
                        self.error("binary messages must be UTF-8 JSON text")
                    continue
            if text is None:
                continue
            if self.unsent() > MAX_UNSENT_ITEMS:
                await self.socket.close(1008, "too many unanswered messages: read what the server sends")
                return
            if not self._admit():
                if self._dropped > FLOOD_CLOSE_AFTER:
                    await self.socket.close(1008, "message rate limit exceeded")
                    return
                continue
            if len(text) > MAX_MESSAGE_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES:
                self.error(f"message too large: at most {MAX_MESSAGE_BYTES} bytes")
                continue
            self.last_message_at = anyio.current_time()
            await self.on_text(text)

    def _admit(self) -> bool:
        """Rate limit: True if this message may be handled."""
        now = anyio.current_time()
        if self.bucket.take(now):
            if self.bucket.level >= self.bucket.burst - 1:
                self._dropped = 0          # it was quiet long enough for the bucket to fill up again
            return True
        self._dropped += 1
        if now - self._last_rate_error >= RATE_ERROR_EVERY_S:
            self._last_rate_error = now
            self.error(f"rate limit: at most {self.bucket.rate:g} messages a second "
                       f"(bursts of {self.bucket.burst}); this message was ignored")
        return False
