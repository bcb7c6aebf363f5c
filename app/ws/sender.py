"""The sending half of a presenter's connection: take everything in the outbox, let the view render it into
few messages, send them, and pace a page at full speed.

    sender = PacedSender(socket, view, outbox, context, pace, streaming, poke_engine)
    sender.run()                  # one of the connection's tasks (app/ws/socket.py, `Socket.serve`)
    sender.acknowledge(n)         # the page has rendered n messages
    sender.wake()                 # rounds pile up, or the generation ended: stop holding the next message

NOTE: at full speed the sender coalesces: what arrives while it waits goes out as one message. For a view
whose page acknowledges what it has rendered (the htmx page, once per animation frame) it waits until the page
has caught up, at most ACK_TIMEOUT_S, and at least MIN_INTERVAL_S between messages while rounds come faster
than one every OWN_MESSAGE_S: a slower model's rounds (SmolLM2's: docs/benchmarks.md, `bench smollm2`) go out
one a message, so its tokens appear as they are made and not in twos and threes ten times a second. Other views
(programs) get each round as soon as it is computed; what piles up while a send is in progress goes out
together. This pacing only coalesces: it never holds the engine (only a client that does not read does,
through the backlog of its SessionLink).
"""
from __future__ import annotations

import logging
import math
from typing import Callable

import anyio
from starlette.websockets import WebSocketDisconnect

from app.protocol import Notice, RenderContext, View
from app.ws.run import ClientPace
from app.ws.socket import MIN_INTERVAL_S, Outbox, Socket

logger = logging.getLogger(__name__)

ACK_TIMEOUT_S = 0.5
# Rounds at least this far apart go out a message each (at most 40 a second: the page's work per message is
# bounded by the engine's pace). Above the engine thread's PAGE_DELIVERY_DELAY_S (app/ws/run.py), so the
# rounds of a fast model, posted together every 20 ms, stay coalesced.
OWN_MESSAGE_S = 0.025
SEND_STALL_S = 30.0             # a send that cannot go out for this long: the client does not read (1008)


class MessagePacing:
    """When a page at full speed may have its next message (the NOTE above), read on `clock`.

    NOTE: `clock` is the event loop's clock unless a test gives another: the sender waits on the event loop
    for the times computed here, so a clock of its own must move with the loop's (a test runs the sender on
    virtual time, tests/virtual_time.py, and gives it that loop's clock).
    """

    def __init__(self, clock: Callable[[], float] = anyio.current_time):
        self.clock = clock
        self.sent = 0                  # messages sent
        self.acked = 0                 # of them, rendered by the page (views that acknowledge)
        self.round_gap = 0.0           # between the last two rounds the sender took
        self._round_at = -math.inf
        self._released_at = -math.inf  # when the last message was let go
        self._earliest = self._deadline = -math.inf

    def round_taken(self) -> None:
        now = self.clock()
        self.round_gap, self._round_at = now - self._round_at, now

    def message_sent(self) -> None:
        self.sent += 1

    def acknowledged(self, rendered: int) -> None:
        self.acked = max(self.acked, rendered)

    def hold(self) -> None:
        """The next message is held: until the page has caught up, at most ACK_TIMEOUT_S after the last one was
        let go, and at least MIN_INTERVAL_S after it while rounds come faster than one every OWN_MESSAGE_S."""
        self._deadline = self._released_at + ACK_TIMEOUT_S
        self._earliest = self._released_at + (MIN_INTERVAL_S if self.round_gap < OWN_MESSAGE_S else 0.0)

    def wait_s(self) -> float:
        """How much longer the held message waits (unless an acknowledgement comes first); 0: it may go."""
        now = self.clock()
        caught_up = self.acked >= self.sent
        if now >= self._deadline or (caught_up and now >= self._earliest):
            return 0.0
        return (self._earliest if caught_up else self._deadline) - now

    def release(self) -> None:
        """The next message may go (or the sender has stopped holding messages)."""
        self._released_at = self.clock()


class PacedSender:
    """Sends a connection's outbox through its socket, rendered by its view.

    `context()` is what the view may know of the connection; `pace` the client's pace (is the page at full
    speed?); `streaming()` whether a generation is still under way (only then are messages held);
    `poke_engine()` wakes the engine thread when a round the sender takes lets a held session go on.
    """

    def __init__(self, socket: Socket, view: View, outbox: Outbox, context: Callable[[], RenderContext],
                 pace: ClientPace, streaming: Callable[[], bool], poke_engine: Callable[[], None],
                 clock: Callable[[], float] = anyio.current_time):
        self.socket, self.view, self.outbox, self.context = socket, view, outbox, context
        self.pace, self.streaming, self.poke_engine = pace, streaming, poke_engine
        self.pacing = MessagePacing(clock)
        self._wake = anyio.Event()        # set by acknowledgements and by the end of a generation

    def acknowledge(self, rendered: int) -> None:
        """The page has rendered `rendered` messages of this connection."""
        self.pacing.acknowledged(rendered)
        self.wake()

    def wake(self) -> None:
        """Wake the sender's pacing (an acknowledgement arrived, a generation ended, or rounds pile up)."""
        self._wake.set()
        self._wake = anyio.Event()

    async def run(self) -> None:
        items: list = []
        try:
            while True:
                items += self._take(await self.outbox.take_all() if not items else self.outbox.take_now())
                messages, items = self._render(items), []
                for text in messages:
                    with anyio.move_on_after(SEND_STALL_S) as stalled:
                        await self.socket.send_text(text)
                    if stalled.cancelled_caught:
                        await self.socket.close(1008, f"the client has read nothing for {SEND_STALL_S:g} s")
                        return
                    self.pacing.message_sent()
                await anyio.sleep(0)      # let other connections run even while the write buffer has room
                if self.pace.page_at_full_speed and self.streaming():
                    items = await self._hold()
                self.pacing.release()
        except (WebSocketDisconnect, OSError, RuntimeError):
            # the client is gone (or we already closed): end everything, which frees the session's blocks
            self.socket.end()

    def _render(self, items: list) -> list[str]:
        """The view's messages for these items. A rendering bug must neither take the connection down nor
        lose the other items' events: on failure each item is rendered alone, and the one that fails is
        replaced by an error."""
        try:
            return self.view.render(items, self.context())
        except Exception:  # noqa: BLE001
            logger.exception("rendering %d items failed; rendering them one by one", len(items))
        messages = []
        for item in items:
            try:
                messages += self.view.render([item], self.context())
            except Exception as e:  # noqa: BLE001
                logger.exception("rendering a %s failed", type(item).__name__)
                try:
                    messages += self.view.render([Notice("error", {
                        "message": f"internal error showing this: {type(e).__name__}", "setting": None})], self.context())
                except Exception:  # noqa: BLE001
                    logger.exception("rendering an error failed")
        return messages

    def _take(self, items: list) -> list:
        """The sender has taken these items: their rounds no longer count as the client's backlog."""
        for item in items:
            link = getattr(item, "link", None)
            if link is not None:
                self.pacing.round_taken()
                link.rounds_taken += 1
                if link.held == "client":
                    self.poke_engine()
        return items

    async def _hold(self) -> list:
        """At full speed, hold the next message until the page has caught up (`MessagePacing.hold`); the end
        of a generation goes out at once (waiting would only delay `done`). Meanwhile it keeps taking what the
        engine delivers (returned, for the next message): this pacing only coalesces, it never holds the
        engine (only a client that does not read does, through the backlog)."""
        self.pacing.hold()
        taken: list = []
        while self.streaming():
            taken += self._take(self.outbox.take_now())
            wait = self.pacing.wait_s()
            if wait <= 0:
                break
            wake = self._wake
            with anyio.move_on_after(wait):
                await wake.wait()
        return taken
