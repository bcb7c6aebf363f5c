"""The sending half of a presenter's connection: take everything in the outbox, let the view render it into
few messages, send them, and pace a page at full speed.

NOTE: at full speed the sender coalesces: what arrives while it waits goes out as one message. For a view
whose page acknowledges what it has rendered (the htmx page, once per animation frame) it waits until the page
has caught up, at most ACK_TIMEOUT_S, and at least MIN_INTERVAL_S between messages while rounds come faster
than one every OWN_MESSAGE_S: a slower model's rounds (SmolLM2's, 30-45 ms) go out one a message, so its tokens
appear as they are made and not in twos and threes ten times a second. Other views
(programs) get each round as soon as it is computed; what piles up while a send is in progress goes out
together. This pacing only coalesces: it never holds the engine (only a client that does not read does,
through the backlog of its SessionLink).
"""
from __future__ import annotations

import logging

import anyio
from starlette.websockets import WebSocketDisconnect

from app.protocol import Notice
from app.ws.socket import MIN_INTERVAL_S

logger = logging.getLogger(__name__)

ACK_TIMEOUT_S = 0.5
# Rounds at least this far apart go out a message each (at most 40 a second: the page's work per message is
# bounded by the engine's pace). Above the engine thread's PAGE_DELIVERY_DELAY_S (app/ws/connection.py), so
# the rounds of a fast model, posted together every 20 ms, stay coalesced.
OWN_MESSAGE_S = 0.025
SEND_STALL_S = 30.0             # a send that cannot go out for this long: the client does not read (1008)


class PacedSender:
    """Mixed into `Connection` (app/ws/connection.py), whose fields it reads: ws, view, outbox, run, speed,
    engine_thread, _tg, _sent, _acked, _wake, _round_at, _round_gap, and its `context()` and `close()`."""

    async def _sender(self) -> None:
        last_send = 0.0
        items: list = []
        try:
            while True:
                items += self._take(await self.outbox.take_all() if not items else self.outbox.take_now())
                messages, items = self._render(items), []
                for text in messages:
                    with anyio.move_on_after(SEND_STALL_S) as stalled:
                        await self._send_text(text)
                    if stalled.cancelled_caught:
                        await self.close(1008, f"the client has read nothing for {SEND_STALL_S:g} s")
                        return
                    self._sent += 1
                await anyio.sleep(0)      # let other connections run even while the write buffer has room
                if self.view.acks and self.speed is None and self.run is not None \
                        and not self.run.ended:
                    items = await self._pace_messages(last_send)
                last_send = anyio.current_time()
        except (WebSocketDisconnect, OSError, RuntimeError):
            # the client is gone (or we already closed): end everything, which frees the session's blocks
            self._tg.cancel_scope.cancel()

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

    async def _send_text(self, text: str) -> None:
        try:
            await self.ws.send_text(text)
        except UnicodeEncodeError:   # a lone surrogate (JSON's "\\ud800") cannot be UTF-8 on the wire
            await self.ws.send_text(text.encode("utf-8", "replace").decode("utf-8"))

    def _take(self, items: list) -> list:
        """The sender has taken these items: their rounds no longer count as the client's backlog."""
        engine_thread = self.engine_thread
        for item in items:
            link = getattr(item, "link", None)
            if link is not None:
                now = anyio.current_time()
                self._round_gap, self._round_at = now - self._round_at, now
                link.rounds_taken += 1
                if link.held == "client" and engine_thread is not None:
                    engine_thread.poke()
        return items

    async def _pace_messages(self, last_send: float) -> list:
        """At full speed, wait before the next message until the page has caught up (see the NOTE above);
        the end of a generation goes out at once (waiting would only delay `done`). Meanwhile it keeps
        taking what the engine delivers (returned, for the next message): this pacing only coalesces, it
        never holds the engine (only a client that does not read does, through the backlog)."""
        deadline = last_send + ACK_TIMEOUT_S
        earliest = last_send + (MIN_INTERVAL_S if self._round_gap < OWN_MESSAGE_S else 0.0)
        taken: list = []
        while self.run is not None and not self.run.ended:
            taken += self._take(self.outbox.take_now())
            now = anyio.current_time()
            caught_up = self._acked >= self._sent
            if now >= deadline or (caught_up and now >= earliest):
                break
            wake = self._wake
            with anyio.move_on_after((earliest if caught_up else deadline) - now):
                await wake.wait()
        return taken

    def _poke(self) -> None:
        """Wake the sender's pacing (an acknowledgement arrived, a generation ended, or rounds pile up)."""
        self._wake.set()
        self._wake = anyio.Event()
