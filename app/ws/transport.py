"""uvicorn's websocket protocol, with the writes of one event-loop turn sent to the socket as one write.

    uvicorn.run(app, ws=WS_PROTOCOL, ...)      # `serve` (cli/main.py) and the tests' live server

Nothing changes on the wire: every websocket message is still its own frame (one JSON object per message
on `/api/ws`, docs/protocol.md). What changes is how the frames reach the kernel. uvicorn writes each
frame to its transport at once, and uvloop turns every write into a `send()` system call; on loopback
(and with TCP_NODELAY) each one also runs the TCP stack and wakes the reader, all while holding the GIL
the engine thread needs. A connection's sender sends a round's messages (a draft, its tokens, the round,
the KV pools, the metrics) without yielding in between; here they are joined and written once, when the
loop next runs its ready callbacks, that is right after the sender yields.

NOTE (invariants):
- Order is kept: every write of the protocol (frames, pings, pongs, close frames) goes through the same
  buffer; `close()` and `write_eof()` flush it first.
- Nothing is held for long: the flush is a `call_soon` scheduled by the first write of a turn. Flow
  control is the real transport's: it pauses the protocol (uvicorn's `writable`) when its own buffer
  grows past its high-water mark, as before.
- A transport that is already closing drops what is pending (the peer is gone), as uvloop would.
- A connection the server has given up on is really gone within `GIVE_UP_S`, whatever the peer does.
  uvicorn waits for the socket to become writable before it writes a close frame, and `transport.close()`
  waits until everything buffered has been written: a peer that never reads would keep both waiting
  forever (its session, its slot and the server's shutdown with them). So a close the app sends waits
  at most `GIVE_UP_S` for room, and once the app has closed, returned or the server shuts down, a
  connection not lost `GIVE_UP_S` later is aborted (TCP reset: the peer reads nothing more anyway).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

WS_PROTOCOL = "app.ws.transport:CoalescingWebSocketProtocol"
GIVE_UP_S = 2.0           # how long a closing connection may wait for a peer that does not read


class CoalescingTransport(asyncio.Transport):
    """A transport whose writes within one turn of the event loop go out as one write of the real one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []
        self.writes = 0        # real writes (for measurements)
        self.chunks = 0        # writes asked for

    def write(self, data) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self.chunks += 1

    def writelines(self, list_of_data) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._transport.is_closing():
            self.writes += 1
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    # everything else is the real transport's
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name, default=None):
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self):
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self):
        return self._transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()


class CoalescingWebSocketProtocol(AutoWebSocketsProtocol):
    """uvicorn's default websocket protocol over a `CoalescingTransport`, closed within bounded time."""

    _abort_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))

    def connection_lost(self, exc) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
        super().connection_lost(exc)

    async def send(self, message) -> None:
        if message["type"] == "websocket.close" and self.handshake_complete and not self.writable.is_set():
            try:
                await asyncio.wait_for(self.writable.wait(), GIVE_UP_S)
            except asyncio.TimeoutError:       # the peer does not read: its close frame could never go out
                self._abort()
        await super().send(message)
        if message["type"] == "websocket.close":
            self._abort_later()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self._abort_later()

    def shutdown(self) -> None:
        super().shutdown()
        self._abort_later()

    def _abort_later(self) -> None:
        if self._abort_timer is None and not self.disconnected:
            self._abort_timer = self.loop.call_later(GIVE_UP_S, self._abort)

    def _abort(self) -> None:
        if not self.disconnected and self.transport is not None:
            self.transport.abort()
