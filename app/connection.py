"""One websocket connection: receive commands, run a generation off the event loop, stream its events.

Both websocket endpoints use this handler; they differ only in their `View` (how messages are parsed and
how events are rendered: HTML fragments for htmx, or JSON objects).

Three tasks in one anyio task group:
- the receiver reads every client message at once, also while a generation streams (uvicorn stops
  reading a socket the app does not receive from, and then pings fail);
- the producer (one per generation) advances the session's event generator one round at a time in a
  worker thread, applying pacing (speed, pause, step) between rounds; it puts each round's events into
  the outbox, which is bounded so that a slow client slows the engine down instead of queueing memory;
- the sender takes everything in the outbox at once, lets the view coalesce it into few messages (one
  per frame when the engine is fast) and sends them.

NOTE (invariants):
- At most one generation per connection. Starting another, reset and disconnect end the current one;
  its producer closes the event generator (which frees the session's KV blocks) before it exits, even
  when cancelled, and only then leaves `Playground.sessions`.
- Pacing is applied here, between rounds; the engine's own timings are never affected by it.
- Bad input is answered with an error item; the connection stays usable.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.state import Playground
from engine.events import Error
from engine.session import GenerationSession
from engine.settings import SettingsError

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
MAX_UNSENT_ITEMS = 512          # a client that sends but never reads is closed (1008) before it costs memory
OUTBOX_MAX_BATCHES = 32         # rounds waiting to be sent before the engine waits for the client
# At full speed the sender coalesces: what arrives while it waits goes out as one message. It waits at least
# MIN_INTERVAL_S between messages (at most 10 a second: each costs the browser a fixed amount of work, taken
# from the engine when no core is free) and, for a view whose page acknowledges what it has rendered (the
# htmx page, once per animation frame), until the page has caught up, at most ACK_TIMEOUT_S; for other
# views FRAME_S.
MIN_INTERVAL_S = 1 / 10
ACK_TIMEOUT_S = 0.5
FRAME_S = 1 / 10
FULL_SPEED_BUDGET_S = 0.012     # at full speed, run rounds for up to this long per worker-thread call


class CommandError(ValueError):
    """A client message that cannot be carried out; answered with an error, the connection stays open."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


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


@dataclass
class Notice:
    """Something the connection (not the engine) has to say: state changes, queued settings, errors."""
    type: str                   # state | settings_queued | error | note | reset | hello
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
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {value!r}", "speed") from None
    if not 0.1 <= speed <= 1000:
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {value!r}", "speed")
    return speed


def next_batch(gen, budget_s: float) -> list:
    """Advance the generator by one round (or more rounds within `budget_s`); runs in a worker thread.

    A round ends with its `metrics` event; `started` is its own batch (nothing computed yet), and the
    generation ends with `done` or `error`.
    """
    out = []
    deadline = time.perf_counter() + budget_s
    for event in gen:
        out.append(event)
        if event.type == "started" or (event.type == "metrics" and time.perf_counter() >= deadline):
            break
        # after done / error the loop runs on to the generator's end, whose `finally` frees the blocks
    return out


def _close(gen, session: GenerationSession) -> None:
    gen.close()         # GeneratorExit inside events() -> session.close()
    session.close()     # idempotent; also covers a generator that never started


class Outbox:
    """Items for the sender, in order. Notices never wait; round batches wait while `max_batches` are queued."""

    def __init__(self, max_batches: int = OUTBOX_MAX_BATCHES):
        self.items: deque = deque()
        self.max_batches = max_batches
        self.num_batches = 0
        self._ready = anyio.Event()
        self._room = anyio.Event()

    def put_notice(self, item: Notice) -> None:
        self.items.append(item)
        self._ready.set()

    async def put_batch(self, item: Batch) -> None:
        while self.num_batches >= self.max_batches:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        self.items.append(item)
        self.num_batches += 1
        self._ready.set()

    async def take_all(self) -> list:
        while not self.items:
            if self._ready.is_set():
                self._ready = anyio.Event()
            await self._ready.wait()
        items = list(self.items)
        self.items.clear()
        self.num_batches = 0
        self._room.set()
        return items


@dataclass
class Run:
    """One generation of this connection."""
    run_id: int
    session: GenerationSession
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    finished: anyio.Event = field(default_factory=anyio.Event)
    stopping: bool = False
    ended: bool = False           # done or error was produced
    round: int = 0
    last_round_at: float = 0.0
    announced_pause: bool = False
    producing: bool = False       # its producer runs (and will give back the session slot)
    sent_settings: dict = field(default_factory=dict)


class Connection:
    def __init__(self, websocket: WebSocket, playground: Playground, view: View, speed: float | None = None):
        self.ws, self.playground, self.view = websocket, playground, view
        self.outbox = Outbox()
        self.run: Run | None = None
        self.speed: float | None = speed
        self.paused = False
        self.step_credits = 0
        self._run_ids = 0
        self._changed = anyio.Event()
        self._wake = anyio.Event()        # set by acknowledgements and by the end of a generation
        self._sent = 0                    # messages sent, and acknowledged by the page (views that ack)
        self._acked = 0
        self._tg: anyio.abc.TaskGroup | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    async def serve(self) -> None:
        self.playground.connections += 1
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._receiver)
                tg.start_soon(self._sender)
        finally:
            self.playground.connections -= 1

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
                    self.error("binary messages must be UTF-8 JSON text")
                    continue
            if text is None:
                continue
            if len(self.outbox.items) > MAX_UNSENT_ITEMS:
                await self.ws.close(code=1008, reason="too many unanswered messages: read what the server sends")
                self._tg.cancel_scope.cancel()
                return
            if len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES:
                self.error(f"message too large: at most {MAX_MESSAGE_BYTES} bytes")
                continue
            try:
                for command in self.view.parse(text, self):
                    await self.handle(command)
            except SettingsError as e:
                self.error(str(e), e.setting)
            except CommandError as e:
                self.error(str(e), e.setting)

    async def _sender(self) -> None:
        last_send = 0.0
        try:
            while True:
                items = await self.outbox.take_all()
                try:
                    messages = self.view.render(items, self)
                except Exception:            # a rendering bug must not take the connection down
                    logger.exception("rendering %d items failed", len(items))
                    messages = []
                for text in messages:
                    await self.ws.send_text(text)
                    self._sent += 1
                await anyio.sleep(0)      # let other connections run even while the write buffer has room
                if self.speed is None and self.run is not None and not self.run.ended:
                    await self._pace_messages(last_send)
                last_send = anyio.current_time()
        except (WebSocketDisconnect, OSError, RuntimeError):
            # the client is gone (or we already closed): end everything, which frees the session's blocks
            self._tg.cancel_scope.cancel()

    async def _pace_messages(self, last_send: float) -> None:
        """At full speed, wait before the next message (see MIN_INTERVAL_S); the end of a generation goes out
        at once (waiting would only delay `done`)."""
        acks = getattr(self.view, "acks", False)
        deadline = last_send + (ACK_TIMEOUT_S if acks else FRAME_S)
        earliest = last_send + MIN_INTERVAL_S
        while self.run is not None and not self.run.ended:
            now = anyio.current_time()
            caught_up = acks and self._acked >= self._sent
            if now >= deadline or (caught_up and now >= earliest):
                return
            wake = self._wake
            with anyio.move_on_after((earliest if caught_up else deadline) - now):
                await wake.wait()

    def _poke(self) -> None:
        """Wake the sender's pacing (an acknowledgement arrived, or a generation ended)."""
        self._wake.set()
        self._wake = anyio.Event()

    def acknowledge(self, rendered: int) -> None:
        """The page has rendered `rendered` messages of this connection."""
        self._acked = max(self._acked, rendered)
        self._poke()

    # --- what the views use --------------------------------------------------------------------------
    def notice(self, type: str, **data) -> None:
        self.outbox.put_notice(Notice(type, data))

    def error(self, message: str, setting: str | None = None) -> None:
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
        return "paused" if self.paused else "running"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

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
            self._notify()
        kind = command.kind
        if kind == "toggle":
            kind = "start" if self.state in ("idle", "done") else "pause" if self.state == "running" else "resume"
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
            # "paused" is announced by the producer once it is idle (after the round in flight, or after
            # the stepped round), so that a client seeing it knows no more rounds are coming
            if kind == "pause":
                self.paused = True
            elif kind == "resume":
                self.paused = False
                self._state_notice()
            elif kind == "step":
                self.paused = True
                self.step_credits += 1
            else:
                run.stopping = True
                run.session.cancel()
                self._state_notice()
            self._notify()
        elif kind == "reset":
            await self.end_run()
            self.notice("reset")
            self._state_notice()
        elif kind == "speed":
            self._state_notice()
        elif kind != "noop":
            raise CommandError(f"unknown command {kind!r}")

    async def start(self, prompt: str | None, settings: dict, paused: bool = False) -> None:
        pg = self.playground
        if pg.engine is None:
            raise CommandError(pg.load_error or "no models loaded")
        if prompt is None:
            raise SettingsError("prompt", "must not be empty")
        await self.end_run()
        if pg.sessions >= pg.config.max_sessions:
            raise CommandError(f"busy: {pg.sessions} generations are running (the limit is "
                               f"{pg.config.max_sessions}); try again in a moment")
        pg.sessions += 1        # the slot is taken now (creating the session awaits); the producer gives it back
        run = None
        try:
            # validates (raises SettingsError); in a worker thread: a fetched model's weights load on first use
            session = await anyio.to_thread.run_sync(GenerationSession, pg.engine, prompt, settings)
            self._run_ids += 1
            run = self.run = Run(self._run_ids, session, sent_settings=dict(settings))
            self.paused, self.step_credits = paused, 0
            await self._tg.start(self._produce, run)
        except BaseException:
            if run is None or not run.producing:
                pg.sessions -= 1
            raise

    def update_settings(self, changes: dict) -> None:
        run = self.run
        if run is None or run.ended:
            raise CommandError("settings: no generation running; they apply to the next start")
        if changes:
            run.session.update_settings(changes)     # validates now, applies at the next round boundary
            run.sent_settings.update(changes)
            self.notice("settings_queued", changes=changes, round=run.round)

    async def end_run(self) -> None:
        """Cancel the current generation (if any) and wait until its blocks are freed."""
        run, self.run = self.run, None
        if run is not None:
            run.scope.cancel()
            await run.finished.wait()

    # --- the producer --------------------------------------------------------------------------------
    async def _wait_turn(self, run: Run) -> None:
        """Return when the next round may run: not paused (or a step is due) and the speed allows."""
        while not run.stopping:
            changed = self._changed
            if self.paused:
                if self.step_credits:
                    self.step_credits -= 1
                    run.announced_pause = False
                    return
                if not run.announced_pause:
                    run.announced_pause = True
                    self._state_notice()
                await changed.wait()
                continue
            run.announced_pause = False
            if self.speed is not None:
                delay = run.last_round_at + 1 / self.speed - anyio.current_time()
                if delay > 0:
                    with anyio.move_on_after(delay):
                        await changed.wait()
                    continue
            return

    async def _produce(self, run: Run, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """NOTE: owns one slot of Playground.sessions (taken by `start`) and gives it back when it ends."""
        gen = run.session.events()
        run.producing = True
        try:
            task_status.started()
            with run.scope:
                first = True
                while True:
                    if not first:
                        await self._wait_turn(run)
                    full_speed = self.speed is None and not self.paused and not run.stopping
                    run.last_round_at = anyio.current_time()
                    events = await anyio.to_thread.run_sync(next_batch, gen,
                                                            FULL_SPEED_BUDGET_S if full_speed and not first else 0.0)
                    if not first:
                        run.round += sum(e.type == "metrics" for e in events)
                    first = False
                    ended = any(e.type in ("done", "error") for e in events)
                    if ended:
                        run.ended = True
                    await self.outbox.put_batch(Batch(run.run_id, events))
                    if ended:
                        self._poke()
                    if ended or not events:
                        return
        except Exception as e:          # an engine bug: say so on this connection, keep the server up
            logger.exception("generation %s failed", run.session.id)
            run.ended = True
            await self.outbox.put_batch(Batch(run.run_id, [Error(f"internal error: {type(e).__name__}: {e}")]))
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_close, gen, run.session)
                self.playground.sessions -= 1
                run.ended = True
                run.finished.set()
