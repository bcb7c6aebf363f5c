"""One websocket connection: receive commands, run a generation on the engine thread, stream its events.

Both websocket endpoints use this handler; they differ only in their `View` (how messages are parsed and
how events are rendered: HTML fragments for htmx, or JSON objects). Watchers (app/watch/watcher.py) share the
socket and its receiver (app/ws/socket.py).

A connection is made of parts that each own their state and speak through their methods:

    socket    Socket        the websocket, its close, the task group of the tasks below (app/ws/socket.py)
    receiver  Receiver      reads every client message at once, also while a generation streams (uvicorn
                            stops reading a socket the app does not receive from, and then pings fail); it
                            enforces the message size, the message rate and UTF-8, and hands the rest to
                            `on_text` (bad input is answered with an error item)
    sender    PacedSender   takes everything in the outbox at once, lets the view coalesce it into few
                            messages (one per frame when the engine is fast) and sends them (app/ws/sender.py)
    pace      ClientPace    pause, steps and speed as the client set them; the engine's gate reads them
                            (app/ws/run.py)

The connection itself handles the commands, owns the current `Run` and the outbox, and runs, beside the
receiver and the sender, in one anyio task group (cancelled together when the client goes):
- a run task per generation (`run_admitted`): it waits for a slot (admission control, app/ws/admission.py),
  hands the session to the engine thread (app/ws/engine_thread.py) or streams it from an external engine
  (app/ws/external.py), and when the generation ends, or is ended, makes sure its KV blocks are freed and
  its slot given back;
- the idle watch stops a generation that has made no progress and heard nothing for `idle_timeout_s`.

The engine thread runs the rounds. Pacing (`pace`: pause, step, speed) and backpressure are its gate for
this session (`SessionLink.may_continue`): a paused session, or one whose client has `OUTBOX_MAX_BATCHES`
rounds not yet taken by the sender, waits at its round boundary, holding only itself.

NOTE (invariants):
- At most one generation per connection. Starting another, reset and disconnect end the current one;
  `end_run` returns once the engine thread has freed its blocks and its slot is given back.
- Pacing is applied between rounds; the engine's own timings are never affected by it.
- Bad input is answered with an error item; the connection stays usable. Only policy violations close
  it (1008: a flood of messages, a client that never reads); a start beyond the queue closes it with 1013.
"""
from __future__ import annotations

import logging
import time

import anyio
from starlette.websockets import WebSocket

from app.logs import log_event
from app.protocol import Batch, Command, CommandError, Notice, RenderContext, View
from app.ws.admission import Busy
from app.ws.engine_thread import PARKED, SessionLink
from app.ws.external import start_external
from app.ws.run import OUTBOX_MAX_BATCHES, ClientPace, Run, next_run_id
from app.ws.sender import PacedSender
from app.ws.socket import Outbox, Receiver, Socket
from engine.serving.request_fit import fit_request
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError, excerpt

logger = logging.getLogger(__name__)

IDLE_CHECK_MAX_S = 15.0
MAX_ERROR_CHARS = 300           # an error message, whatever it quotes of the input


class Connection:
    """A presenter's connection: one generation at a time, followed by any number of watchers. `playground` is
    the app's Playground (app/state.py, which makes connections: it is not imported here)."""

    def __init__(self, websocket: WebSocket, playground, view: View, speed: float | None = None,
                 key: str | None = None):
        self.playground = playground
        self.view = view
        self.outbox = Outbox()
        self.run: Run | None = None
        self.pace = ClientPace(acks=view.acks, speed=speed)
        self.key = key
        self.room = None                  # app/watch/rooms.py: where watchers follow this connection
        self.watch_id: str | None = None
        self.socket = Socket(websocket, release=self.release)
        self.receiver = Receiver(self.socket, playground.config, self.on_text, self.error, unsent=lambda: len(self.outbox))
        self.sender = PacedSender(self.socket, view, self.outbox, self.context, self.pace, self.streaming,
                                  self.poke_engine)

    def context(self) -> RenderContext:
        """What the view may know of this connection."""
        return RenderContext(self.run.run_id if self.run else None, self.pace.paused, self.state, self.pace.speed,
                             self.watch_id)

    def streaming(self) -> bool:
        """A generation is under way (queued, running, paused or stopping)."""
        return self.run is not None and not self.run.ended

    # --- lifecycle -------------------------------------------------------------------------------
    async def serve(self) -> None:
        pg = self.playground
        pg.connections += 1
        if self.key is not None and pg.rooms is not None:
            pg.rooms.join_presenter(self, self.key)
        try:
            await self.socket.serve(self.receiver.run, self.sender.run, self._idle_watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self.end_run()
            pg.connections -= 1
            if self.room is not None:
                pg.rooms.leave_presenter(self)

    async def release(self) -> None:
        """The generation's KV blocks and slot go at once, not once the peer has been dealt with."""
        with anyio.CancelScope(shield=True):
            await self.end_run()

    async def on_text(self, text: str) -> None:
        try:
            for item in self.view.parse(text, self.context()):
                if isinstance(item, Notice):
                    self.notice(item.type, **item.data)
                else:
                    await self.handle(item)
        except SettingsError as e:
            self.error(str(e), e.setting)
        except CommandError as e:
            self.error(str(e), e.setting)
        except RecursionError:
            self.error("not valid JSON: nested too deeply")
        except Exception as e:  # noqa: BLE001 - a bug handling one message must not end the connection
            logger.exception("handling a message failed")
            self.error(f"internal error handling this message: {type(e).__name__}")

    def poke_engine(self) -> None:
        """Wake the engine thread: the pace changed, or a held session may go on."""
        if self.playground.engine_thread is not None:
            self.playground.engine_thread.poke()

    async def _idle_watch(self) -> None:
        """Stop a generation that has made no progress and heard nothing from its client for
        `idle_timeout_s` (a forgotten paused tab, a client that stopped reading): its blocks and slot go."""
        timeout = self.playground.config.idle_timeout_s
        while True:
            await anyio.sleep(min(timeout / 4, IDLE_CHECK_MAX_S))
            run = self.run
            if run is None or run.ended or run.queued or run.stopping:
                continue
            quiet = anyio.current_time() - max(self.receiver.last_message_at, run.last_progress_at)
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
            message = message[:MAX_ERROR_CHARS - 1] + "…"
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
        return "paused" if self.pace.paused else "running"

    def _state_notice(self) -> None:
        self.notice("state", state=self.state, round=self.run.round if self.run else 0,
                    speed=self.pace.speed, paused=self.pace.paused)

    # --- commands ----------------------------------------------------------------------------------
    async def handle(self, command: Command) -> None:
        if command.kind == "ack":
            self.sender.acknowledge(command.ack)
            return
        if command.speed != "keep":
            self.pace.speed = command.speed
            self.poke_engine()
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
                self.pace.paused = True
            elif kind == "resume":
                self.pace.paused = False
                self._state_notice()
            elif kind == "step":
                self.pace.paused = True
                self.pace.steps_granted += 1
            elif run.queued:                  # stop while waiting for a slot: leave the line
                await self.end_run()
                self._state_notice()
            else:
                self._stop(run)
                self._state_notice()
            self.poke_engine()
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
        self.poke_engine()

    async def start(self, prompt: str | None, settings: dict, paused: bool = False) -> None:
        pg = self.playground
        external = pg.external.get(settings.get("model")) if isinstance(settings.get("model"), str) else None
        if external is not None:               # a server the operator configured (app/ws/external.py)
            return await start_external(self, external, prompt, settings, paused)
        if pg.engine is None or pg.engine_thread is None:
            raise CommandError(pg.load_error or "no models loaded")
        if prompt is None:
            raise SettingsError("prompt", "must not be empty")
        await self.end_run()
        requested_at = time.perf_counter()
        # the model and the settings left out, as the engine decides them (engine/serving/request_fit.py; raises
        # SettingsError naming a setting no model can take, before anything is loaded or announced)
        fit = fit_request(pg.engine.registry, settings)
        settings = fit.settings
        if fit.note:
            self.notice("note", kind="model_chosen", text=fit.note)
        if fit.model in pg.loading():
            self.notice("note", kind="loading", text=f"loading the weights of {fit.model} (once, after the server "
                                                     "started); the run starts when they are in memory")
        # validates (raises SettingsError); in a worker thread: a fetched model's weights load on first use
        session = await anyio.to_thread.run_sync(GenerationSession, pg.engine, prompt, settings)
        run = self.run = Run(next_run_id(), session, sent_settings=dict(settings))
        self.pace.paused = paused
        run.link = SessionLink(session, self.pace, lambda item: self.deliver(run, item), OUTBOX_MAX_BATCHES,
                               None if paused else requested_at)
        if self.room is not None:
            self.room.run_started(run)
        await self.socket.tasks.start(self._run_task, run)

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
        """A generation of our engine: once admitted, the engine thread runs it until it ends (or is ended)."""
        engine_thread = self.playground.engine_thread

        async def generate() -> None:
            try:
                await engine_thread.add(run.session, run.link)
            except Exception as e:  # noqa: BLE001 - a bug: say so on this connection, keep it open
                logger.exception("handing generation %s to the engine thread failed", run.session.id)
                self.error(f"internal error: {type(e).__name__}: {e}")
                return
            await run.ended_event.wait()

        async def release() -> None:
            await engine_thread.remove(run.session)   # frees its blocks; a no-op if it ended by itself

        await self.run_admitted(run, generate, release, _described(run.session), task_status=task_status)

    async def run_admitted(self, run: Run, generate, release, described: dict, *,
                           task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Wait for a slot (admission control, app/ws/admission.py), then `await generate()`.

        NOTE: however it ends (done, error, stop, reset, a new start, disconnect, busy), the `finally` awaits
        `release()` (the session's blocks or stream go) and then gives its slot back, shielded from
        cancellation. A start beyond the line closes the connection with 1013. Our engine's runs and an
        external engine's (app/ws/external.py) both wait here.
        """
        admission = self.playground.admission
        admitted = False
        try:
            with run.scope:
                task_status.started()
                try:
                    await admission.acquire(lambda position: self._queued(run, position))
                except Busy as e:
                    log_event(logger, "refused_busy", running=admission.running, waiting=admission.waiting)
                    self.run = None
                    await self.socket.close(1013, str(e))
                    return
                admitted = True
                run.queued = False
                run.last_progress_at = anyio.current_time()
                if run.position:
                    self._state_notice()
                log_event(logger, "generation_started", session=run.session.id, **described)
                await generate()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await release()
                finally:
                    if admitted:
                        admission.release()
                    run.ended = True
                    run.finished.set()

    def _queued(self, run: Run, position: int) -> None:
        run.position = position
        adm = self.playground.admission
        self.notice("queued", position=position, running=adm.running, max_sessions=adm.limit)

    def deliver(self, run: Run, item) -> None:
        """Events of one round (or PARKED) from the engine thread; on the event loop."""
        if run is not self.run:
            return                        # a generation that was ended meanwhile (reset, new start)
        if item is PARKED:
            if not run.ended and self.pace.paused and run.link.steps_used >= self.pace.steps_granted:
                self._state_notice()
            return
        run.round += sum(e.type == "metrics" for e in item)
        run.last_progress_at = anyio.current_time()
        last = item[-1]
        batch = Batch(run.run_id, item, run.link)
        self.outbox.put_batch(batch)
        if run.link.backlog >= OUTBOX_MAX_BATCHES // 2:
            self.sender.wake()            # a pacing sender takes them before the engine would be held
        if self.room is not None:
            self.room.publish(batch)
        if last.type in ("done", "error"):
            run.ended = True
            run.ended_event.set()
            self.sender.wake()
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
