"""One websocket connection: receive commands, run a generation on the engine thread, stream its events.

Both websocket endpoints use this handler; they differ only in their `View` (how messages are parsed and
how events are rendered: HTML fragments for htmx, or JSON objects). Watchers (app/rooms.py) share the
receiving half (`Socket`).

Tasks of one connection, in one anyio task group (cancelled together when the client goes):
- the receiver reads every client message at once, also while a generation streams (uvicorn stops
  reading a socket the app does not receive from, and then pings fail); it enforces the message size,
  the message rate and UTF-8, and answers bad input with an error item;
- the sender takes everything in the outbox at once, lets the view coalesce it into few messages (one
  per frame when the engine is fast) and sends them;
- a run task per generation: it waits for a slot (admission control, app/admission.py), hands the session
  to the engine thread (app/engine_thread.py), and when the generation ends, or is ended, makes sure its
  KV blocks are freed and its slot given back;
- the idle watch stops a generation that has made no progress and heard nothing for `idle_timeout_s`.

The engine thread runs the rounds. Pacing (pause, step, speed) and backpressure are its gate for this
session (`SessionLink.may_continue`): a paused session, or one whose client has `OUTBOX_MAX_BATCHES`
rounds not yet taken by the sender, waits at its round boundary, holding only itself.

NOTE (invariants):
- At most one generation per connection. Starting another, reset and disconnect end the current one;
  `end_run` returns once the engine thread has freed its blocks and its slot is given back.
- Pacing is applied between rounds; the engine's own timings are never affected by it.
- Bad input is answered with an error item; the connection stays usable. Only policy violations close
  it (1008: a flood of messages, a client that never reads); a start beyond the queue closes it with 1013.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.admission import Busy
from app.config import MAX_MESSAGE_BYTES
from app.engine_thread import PARKED, SessionLink
from app.external import start_external
from app.logs import log_event
from app.security import TokenBucket
from engine.session import GenerationSession
from engine.settings import SettingsError, excerpt

if TYPE_CHECKING:
    from app.state import Playground

logger = logging.getLogger(__name__)

MAX_UNSENT_ITEMS = 512          # a client that sends but never reads is closed (1008) before it costs memory
OUTBOX_MAX_BATCHES = 32         # rounds waiting to be sent before the engine holds the session for its client
FLOOD_CLOSE_AFTER = 2000        # messages over the rate limit without a pause: the connection is closed (1008)
RATE_ERROR_EVERY_S = 1.0        # at most one "rate limit" error a second
# At full speed the sender coalesces: what arrives while it waits goes out as one message. For a view whose
# page acknowledges what it has rendered (the htmx page, once per animation frame) it waits at least
# MIN_INTERVAL_S between messages (at most 10 a second: each costs the browser a fixed amount of work,
# taken from the engine when no core is free) and until the page has caught up, at most ACK_TIMEOUT_S.
# Other views (programs) get each round as soon as it is computed; what piles up while a send is in
# progress goes out together.
MIN_INTERVAL_S = 1 / 10
# For such a page at full speed the engine thread also posts its rounds to the event loop together, at most
# this late: each post wakes the event loop, which then takes the GIL from the engine thread. Measured
# 2026-11-29 (400 plain-decoding tokens, /ws client, same-process A/B): tokens/s through the server 76% of
# the engine alone when every round was posted, 84-91% with 10-20 ms.
PAGE_DELIVERY_DELAY_S = 0.02
ACK_TIMEOUT_S = 0.5
IDLE_CHECK_MAX_S = 15.0
MAX_ERROR_CHARS = 300           # an error message, whatever it quotes of the input
SEND_STALL_S = 30.0             # a send that cannot go out for this long: the client does not read (1008)
CLOSE_WAIT_S = 5.0              # at most this long for a close the server decided (the transport gives up sooner)
_run_ids = itertools.count(1)   # process-wide: a watcher follows runs across its presenter's reconnects


class CommandError(ValueError):
    """A client message that cannot be carried out; answered with an error, the connection stays open."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


def json_object(text: str, what: str) -> dict:
    """A client message as a JSON object, or a CommandError saying what was expected (`what`).

    Its text must be Unicode: JSON can spell a lone UTF-16 surrogate (`"\\ud800"`), which no tokenizer
    and no UTF-8 encoder takes, so it is refused here, naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CommandError(f"not valid JSON: {e}") from None
    except ValueError as e:       # e.g. an integer of more than 4,300 digits (Python's conversion limit)
        raise CommandError(f"not valid JSON: {excerpt(str(e), 120)}") from None
    if not isinstance(data, dict):
        raise CommandError(what)
    if _SURROGATE_ESCAPE.search(text):
        field = _lone_surrogate(data)
        if field is not None:
            raise CommandError(f"{field}: not valid text (a lone UTF-16 surrogate such as \\ud800)", field)
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value, name: str = "message") -> str | None:
    """The name of the first field (or key) of `value` whose text holds a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name
    elif isinstance(value, dict):
        for key, item in value.items():
            if _lone_surrogate(key) is not None:
                return "a field name"
            if (found := _lone_surrogate(item, key[:40])) is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            if (found := _lone_surrogate(item, name)) is not None:
                return found
    return None


# --- commands (what the views parse client messages into) -----------------------------------------
@dataclass
class Command:
    kind: str                   # start | settings | pause | resume | toggle | step | stop | reset | speed | noop
    prompt: str | None = None
    settings: dict = field(default_factory=dict)
    speed: float | None | str = "keep"   # rounds per second, None for full speed, "keep" for no change
    paused: bool = False
    ack: int = 0                # for "ack": how many server messages the page has rendered


# --- items (what the sender hands to the view) ---------------------------------------------------
@dataclass
class Batch:
    """The events of one or more rounds of one generation, in order."""
    run_id: int
    events: list
    link: Any = None            # the SessionLink it came through (its sender counts what it takes)


@dataclass
class Notice:
    """Something the connection (not the engine) has to say: state changes, queued settings, errors."""
    type: str                   # state | queued | settings_queued | error | note | reset | hello
    data: dict


class View(Protocol):
    def parse(self, text: str, conn: "Connection") -> list[Command]: ...
    def render(self, items: list, conn: "Connection") -> list[str]: ...


def parse_speed(value: Any) -> float | None:
    """Rounds per second (0.1 ... 1000), or None for full speed ('max', 0 or empty)."""
    if value is None or value in ("", "max", "full", 0, "0"):
        return None
    try:
        speed = float(value)
    except (TypeError, ValueError):
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {excerpt(value)}", "speed") from None
    if not 0.1 <= speed <= 1000:
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {excerpt(value)}", "speed")
    return speed


class Outbox:
    """Items for the sender, in order. Never waits: the engine thread's gate bounds the rounds in it."""

    def __init__(self):
        self.items: deque = deque()
        self._ready = anyio.Event()

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


class Socket:
    """The receiving half every websocket of the app shares: limits first, then `on_text`.

    NOTE: a message over MAX_MESSAGE_BYTES, binary that is not UTF-8, or a message over the rate limit is
    answered with an error (the rate error at most once a second) and otherwise ignored. A client that goes
    over the rate FLOOD_CLOSE_AFTER times without once letting its bucket fill up again is closed (1008).
    """

    def __init__(self, websocket: WebSocket, playground: Playground):
        self.ws, self.playground = websocket, playground
        cfg = playground.config
        self.bucket = TokenBucket(cfg.messages_per_s, cfg.message_burst)
        self.last_message_at = anyio.current_time()
        self.closed: int | None = None
        self._dropped = 0
        self._last_rate_error = -1e9
        self._tg: anyio.abc.TaskGroup | None = None

    def error(self, message: str, setting: str | None = None) -> None:
        raise NotImplementedError

    async def on_text(self, text: str) -> None:
        raise NotImplementedError

    async def close(self, code: int, reason: str) -> None:
        """Close the websocket (if it is still open) and end every task of this connection."""
        if self.closed is None:
            self.closed = code
            log_event(logger, "ws_closed_by_server", code=code, reason=reason)
            await self.release()
            # bounded: the transport gives up on a peer that does not read (app/ws_transport.py)
            with anyio.move_on_after(CLOSE_WAIT_S, shield=True):
                try:
                    await self.ws.close(code=code, reason=reason[:120])
                except (RuntimeError, OSError, WebSocketDisconnect):
                    pass
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    def unsent(self) -> int:
        return 0

    async def release(self) -> None:
        """Give back what this connection holds (before its close, which may take a moment)."""

    async def _receiver(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self._tg.cancel_scope.cancel()
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
                await self.close(1008, "too many unanswered messages: read what the server sends")
                return
            if not self._admit():
                if self._dropped > FLOOD_CLOSE_AFTER:
                    await self.close(1008, "message rate limit exceeded")
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


@dataclass(eq=False)
class Run:
    """One generation of this connection."""
    run_id: int
    session: GenerationSession
    link: SessionLink | None = None
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


class Connection(Socket):
    """A presenter's connection: one generation at a time, followed by any number of watchers."""

    def __init__(self, websocket: WebSocket, playground: Playground, view: View, speed: float | None = None,
                 key: str | None = None):
        super().__init__(websocket, playground)
        self.view = view
        self.outbox = Outbox()
        self.run: Run | None = None
        self.speed: float | None = speed
        self.paused = False
        self.steps_granted = 0
        self.key = key
        self.room = None                  # app/rooms.py: where watchers follow this connection
        self.watch_id: str | None = None
        self._wake = anyio.Event()        # set by acknowledgements and by the end of a generation
        self._sent = 0                    # messages sent, and acknowledged by the page (views that ack)
        self._acked = 0

    @property
    def delivery_delay_s(self) -> float:
        """Pacing for the engine thread: how long a round may wait to be posted with later ones."""
        return PAGE_DELIVERY_DELAY_S if getattr(self.view, "acks", False) and self.speed is None else 0.0

    # --- lifecycle -------------------------------------------------------------------------------
    async def serve(self) -> None:
        pg = self.playground
        pg.connections += 1
        if self.key is not None and pg.rooms is not None:
            pg.rooms.join_presenter(self, self.key)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._receiver)
                tg.start_soon(self._sender)
                tg.start_soon(self._idle_watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self.end_run()
            pg.connections -= 1
            if self.room is not None:
                pg.rooms.leave_presenter(self)

    def unsent(self) -> int:
        return len(self.outbox.items)

    async def release(self) -> None:
        """The generation's KV blocks and slot go at once, not once the peer has been dealt with."""
        with anyio.CancelScope(shield=True):
            await self.end_run()

    async def on_text(self, text: str) -> None:
        try:
            for command in self.view.parse(text, self):
                await self.handle(command)
        except SettingsError as e:
            self.error(str(e), e.setting)
        except CommandError as e:
            self.error(str(e), e.setting)
        except RecursionError:
            self.error("not valid JSON: nested too deeply")
        except Exception as e:  # noqa: BLE001 - a bug handling one message must not end the connection
            logger.exception("handling a message failed")
            self.error(f"internal error handling this message: {type(e).__name__}")

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
                if getattr(self.view, "acks", False) and self.speed is None and self.run is not None \
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
            return self.view.render(items, self)
        except Exception:  # noqa: BLE001
            logger.exception("rendering %d items failed; rendering them one by one", len(items))
        messages = []
        for item in items:
            try:
                messages += self.view.render([item], self)
            except Exception as e:  # noqa: BLE001
                logger.exception("rendering a %s failed", type(item).__name__)
                try:
                    messages += self.view.render([Notice("error", {
                        "message": f"internal error showing this: {type(e).__name__}", "setting": None})], self)
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
        engine_thread = self.playground.engine_thread
        for item in items:
            link = getattr(item, "link", None)
            if link is not None:
                link.rounds_taken += 1
                if link.held == "client" and engine_thread is not None:
                    engine_thread.poke()
        return items

    async def _pace_messages(self, last_send: float) -> list:
        """At full speed, wait before the next message until the page has caught up (see MIN_INTERVAL_S);
        the end of a generation goes out at once (waiting would only delay `done`). Meanwhile it keeps
        taking what the engine delivers (returned, for the next message): this pacing only coalesces, it
        never holds the engine (only a client that does not read does, through the backlog)."""
        deadline = last_send + ACK_TIMEOUT_S
        earliest = last_send + MIN_INTERVAL_S
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

    def _poke_engine(self) -> None:
        if self.playground.engine_thread is not None:
            self.playground.engine_thread.poke()

    def acknowledge(self, rendered: int) -> None:
        """The page has rendered `rendered` messages of this connection."""
        self._acked = max(self._acked, rendered)
        self._poke()

    async def _idle_watch(self) -> None:
        """Stop a generation that has made no progress and heard nothing from its client for
        `idle_timeout_s` (a forgotten paused tab, a client that stopped reading): its blocks and slot go."""
        timeout = self.playground.config.idle_timeout_s
        while True:
            await anyio.sleep(min(timeout / 4, IDLE_CHECK_MAX_S))
            run = self.run
            if run is None or run.ended or run.queued or run.stopping:
                continue
            quiet = anyio.current_time() - max(self.last_message_at, run.last_progress_at)
            if quiet >= timeout:
                log_event(logger, "idle_timeout", session=run.session.id, quiet_s=round(quiet, 1))
                self.notice("note", kind="idle", text=f"stopped after {quiet:.0f} s without progress or a message "
                                                      "(idle timeout): its KV blocks are free again")
                self._stop(run)

    # --- what the views use --------------------------------------------------------------------------
    def notice(self, type: str, **data) -> None:
        notice = Notice(type, data)
        self.outbox.put_notice(notice)
        if self.room is not None and type in ("state", "reset", "settings_queued", "queued"):
            self.room.publish(notice)

    def error(self, message: str, setting: str | None = None) -> None:
        if len(message) > MAX_ERROR_CHARS:     # never echo a client's long input back (the excerpts are short)
            message = message[:MAX_ERROR_CHARS] + "…"
        self.notice("error", message=message, setting=setting)

    @property
    def state(self) -> str:
        run = self.run
        if run is None:
            return "idle"
        if run.ended:
            return "done"
        if run.stopping:
            return "stopping"
        if run.queued:
            return "queued"
        return "paused" if self.paused else "running"

    def _state_notice(self) -> None:
        self.notice("state", state=self.state, round=self.run.round if self.run else 0,
                    speed=self.speed, paused=self.paused)

    # --- commands ----------------------------------------------------------------------------------
    async def handle(self, command: Command) -> None:
        if command.kind == "ack":
            self.acknowledge(command.ack)
            return
        if command.speed != "keep":
            self.speed = command.speed
            self._poke_engine()
        kind = command.kind
        if kind == "toggle":
            state = self.state
            kind = "start" if state in ("idle", "done") else "pause" if state in ("running", "queued") else "resume"
        if kind == "start":
            await self.start(command.prompt, command.settings, paused=command.paused)
        elif kind == "settings":
            self.update_settings(command.settings)
        elif kind in ("pause", "resume", "step", "stop"):
            if kind == "step" and command.prompt is not None and self.state in ("idle", "done"):
                await self.start(command.prompt, command.settings, paused=True)
            run = self.run
            if run is None or run.ended:
                raise CommandError(f"{kind}: no generation running; send start first")
            # "paused" is announced once the engine has come to rest (after the round in flight, or after
            # the stepped round), so that a client seeing it knows no more rounds are coming
            if kind == "pause":
                self.paused = True
            elif kind == "resume":
                self.paused = False
                self._state_notice()
            elif kind == "step":
                self.paused = True
                self.steps_granted += 1
            elif run.queued:                  # stop while waiting for a slot: leave the line
                await self.end_run()
                self._state_notice()
            else:
                self._stop(run)
                self._state_notice()
            self._poke_engine()
        elif kind == "reset":
            await self.end_run()
            self.notice("reset")
            self._state_notice()
        elif kind == "speed":
            self._state_notice()
        elif kind != "noop":
            raise CommandError(f"unknown command {excerpt(kind)}")

    def _stop(self, run: Run) -> None:
        run.stopping = True
        run.session.cancel()
        if run.link is not None:
            run.link.stopping = True
        self._poke_engine()

    async def start(self, prompt: str | None, settings: dict, paused: bool = False) -> None:
        pg = self.playground
        external = pg.external.get(settings.get("model")) if isinstance(settings.get("model"), str) else None
        if external is not None:               # a server the operator configured (app/external.py)
            return await start_external(self, external, prompt, settings, paused)
        if pg.engine is None or pg.engine_thread is None:
            raise CommandError(pg.load_error or "no models loaded")
        if prompt is None:
            raise SettingsError("prompt", "must not be empty")
        await self.end_run()
        requested_at = time.perf_counter()
        model = settings.get("model") if isinstance(settings, dict) else None
        if model and model in pg.loading():
            self.notice("note", kind="loading", text=f"loading the weights of {model} (once, after the server "
                                                     "started); the run starts when they are in memory")
        # validates (raises SettingsError); in a worker thread: a fetched model's weights load on first use
        session = await anyio.to_thread.run_sync(GenerationSession, pg.engine, prompt, settings)
        run = self.run = Run(next(_run_ids), session, sent_settings=dict(settings))
        self.paused = paused
        run.link = SessionLink(session, self, lambda item: self._deliver(run, item), OUTBOX_MAX_BATCHES,
                               None if paused else requested_at)
        if self.room is not None:
            self.room.run_started(run)
        await self._tg.start(self._run_task, run)

    def update_settings(self, changes: dict) -> None:
        run = self.run
        if run is None or run.ended:
            raise CommandError("settings: no generation running; they apply to the next start")
        if changes:
            run.session.update_settings(changes)     # validates now, applies at the next round boundary
            run.sent_settings.update(changes)
            self.notice("settings_queued", changes=changes, round=run.round)

    async def end_run(self) -> None:
        """End the current generation (if any) and wait until its blocks are freed and its slot given back."""
        run, self.run = self.run, None
        if run is not None:
            run.scope.cancel()
            await run.finished.wait()

    # --- the run -------------------------------------------------------------------------------------
    async def _run_task(self, run: Run, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Wait for a slot, hand the session to the engine thread, wait for its end.

        NOTE: however it ends (done, error, stop, reset, a new start, disconnect, busy), the `finally`
        removes the session from the engine thread (which frees its blocks; a no-op if it ended by itself)
        and then gives its slot back, shielded from cancellation.
        """
        pg = self.playground
        admitted = False
        try:
            with run.scope:
                task_status.started()
                try:
                    await pg.admission.acquire(lambda position: self._queued(run, position))
                except Busy as e:
                    log_event(logger, "refused_busy", running=pg.admission.running, waiting=pg.admission.waiting)
                    self.run = None
                    await self.close(1013, str(e))
                    return
                admitted = True
                run.queued = False
                run.last_progress_at = anyio.current_time()
                if run.position:
                    self._state_notice()
                log_event(logger, "generation_started", session=run.session.id, **_described(run.session))
                try:
                    await pg.engine_thread.add(run.session, run.link)
                except Exception as e:  # noqa: BLE001 - a bug: say so on this connection, keep it open
                    logger.exception("handing generation %s to the engine thread failed", run.session.id)
                    self.error(f"internal error: {type(e).__name__}: {e}")
                    return
                await run.ended_event.wait()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await pg.engine_thread.remove(run.session)
                finally:
                    if admitted:
                        pg.admission.release()
                    run.ended = True
                    run.finished.set()

    def _queued(self, run: Run, position: int) -> None:
        run.position = position
        adm = self.playground.admission
        self.notice("queued", position=position, running=adm.running, max_sessions=adm.limit)

    def _deliver(self, run: Run, item) -> None:
        """Events of one round (or PARKED) from the engine thread; on the event loop."""
        if run is not self.run:
            return                        # a generation that was ended meanwhile (reset, new start)
        if item is PARKED:
            if not run.ended and self.paused and run.link.steps_used >= self.steps_granted:
                self._state_notice()
            return
        run.round += sum(e.type == "metrics" for e in item)
        run.last_progress_at = anyio.current_time()
        last = item[-1]
        batch = Batch(run.run_id, item, run.link)
        self.outbox.put_batch(batch)
        if run.link.backlog >= OUTBOX_MAX_BATCHES // 2:
            self._poke()                  # a pacing sender takes them before the engine would be held
        if self.room is not None:
            self.room.publish(batch)
        if last.type in ("done", "error"):
            run.ended = True
            run.ended_event.set()
            self._poke()
            if last.type == "done":
                s = last.summary
                log_event(logger, "generation_done", session=run.session.id, finish_reason=s.get("finish_reason"),
                          num_output_tokens=s.get("num_output_tokens"), elapsed_s=round(s.get("elapsed_s") or 0, 4))
            else:
                log_event(logger, "generation_error", session=run.session.id, message=last.message[:200])


def _described(session: GenerationSession) -> dict:
    """What a log line may say about a generation: its settings, never its prompt."""
    s = session.settings
    return {"model": session.target_lm.name, "method": s.method, "num_speculative_tokens": s.num_speculative_tokens,
            "max_tokens": s.max_tokens, "kv_cache_dtype": s.kv_cache_dtype, "prompt_tokens": len(session.prompt_ids)}
