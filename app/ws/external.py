"""External engines (OpenAI-compatible servers) as the page and /api/ws see them.

The operator configures them at start-up (`serve --openai-url ...`, and the embedded llama.cpp server that
`serve` starts on the fetched GGUF); a client only names one. A generation on one is an asyncio task on
the connection (it waits on the network, never on our engine thread) that reads `engine/external/openai_stream.py`'s
events and delivers them as the engine thread would: one chunk's events at a time, through the same
`Connection.deliver`, held between chunks while the client lags behind, while paused, or by its speed.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, nullcontext
from dataclasses import dataclass

import anyio
import httpx

from app.protocol import CommandError
from app.ws.engine_thread import PARKED
from app.ws.run import OUTBOX_MAX_BATCHES, Run, next_run_id
from engine.external.llamacpp_server import NGRAM, EmbeddedLlamaCpp, draft_gguf, gguf_path, unavailable_reason
from engine.external.openai_stream import ExternalEngine, stream_chat, validated
from engine.external.server_metrics import SharedScrapes, fetch_server_config
from engine.serving.events import Done

logger = logging.getLogger(__name__)

HOLD_POLL_S = 0.02                  # how often a held external run re-checks its gate
# a llama.cpp server started here that gave no /v1/models is asked again (twice, a second apart): on a loaded
# machine the first read can miss its timeout while our own models load beside it
CONFIG_READS, CONFIG_RETRY_S = 3, 1.0


def start_embedded_llamacpp(threads: int) -> list[EmbeddedLlamaCpp]:
    """llama.cpp on the fetched GGUF, plain, with its n-gram speculation and with SmolLM2's draft model (three
    servers, `threads` each, started side by side); none, with the reason logged, where the wheel or the file is
    missing or it fails to start (the draft model's alone where its GGUF is missing)."""
    path = gguf_path()
    reason = unavailable_reason(path)
    if reason:
        logger.warning("llama.cpp not offered: %s", reason)
        return []
    kinds = [(None, None), (NGRAM, None)]
    if draft_gguf().is_file():
        kinds.append((None, draft_gguf()))
    else:
        logger.warning("llama.cpp's draft model not offered: %s is missing (decoding-playground fetch-model)",
                       draft_gguf())
    with ThreadPoolExecutor(len(kinds), thread_name_prefix="llamacpp-start") as pool:   # each waits for its child
        started = list(pool.map(lambda kind: start_one_llamacpp(path, threads, *kind), kinds))
    return [server for server in started if server is not None]


def start_one_llamacpp(path, threads: int, ngram, draft) -> EmbeddedLlamaCpp | None:
    try:
        server = EmbeddedLlamaCpp.start(path, threads=threads, ngram=ngram, draft=draft)
    except Exception as e:  # noqa: BLE001 - the rest of the playground serves without it
        logger.error("llama.cpp could not start on %s: %s: %s", path, type(e).__name__, e)
        return None
    logger.warning("%s: %s on %s with %d thread(s) (loopback only, API key per process); its own output: %s",
                   server.engine.name, path.name, server.engine.base_url, threads, server.log_path)
    return server


async def publish_server_config(engines: list[ExternalEngine]) -> None:
    """What each server publishes about itself (/v1/models, llama.cpp's /props) goes into its description
    (the model list), read at start-up; an engine that is down is offered anyway, and says so."""
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        configs = [await fetch_server_config(e, client) for e in engines]
        for _ in range(CONFIG_READS - 1):
            missing = [i for i, (e, config) in enumerate(zip(engines, configs))
                       if e.kind == "llamacpp" and not config.get("models")]
            if not missing:
                break
            await asyncio.sleep(CONFIG_RETRY_S)
            for i in missing:
                configs[i] = await fetch_server_config(engines[i], client)
    for engine, config in zip(engines, configs):
        engine.description["published"] = config
        if not config.get("models"):
            logger.warning("%s: no answer from its /v1/models at start-up (down?)", engine.name)


@dataclass
class ExternalSession:
    """What a `Run` holds for a generation on an external engine (the interface of GenerationSession it uses)."""
    engine: ExternalEngine
    prompt: str
    settings: dict
    id: str = ""

    def __post_init__(self):
        self.id = self.id or uuid.uuid4().hex[:12]
        self.scope = anyio.CancelScope()

    def cancel(self) -> None:
        """Stop: the stream is closed now, wherever it waits."""
        self.scope.cancel()

    close = cancel

    def update_settings(self, changes: dict) -> None:
        raise CommandError(f"settings: {self.engine.name} takes its settings once, at start; "
                           "they apply to the next start", next(iter(changes), None))

    def described(self) -> dict:
        return {"model": self.engine.name, "engine": self.engine.kind, "max_tokens": self.settings.get("max_tokens")}


class ExternalLink:
    """The gate of an external run, as `SessionLink` is for the engine thread (same fields the connection reads)."""

    def __init__(self, session: ExternalSession, pacing, max_backlog: int):
        self.session, self.pacing, self.max_backlog = session, pacing, max_backlog
        self.stopping = False
        self.rounds_taken = 0
        self.rounds_sent = 0
        self.steps_used = pacing.steps_granted
        self.held: str | None = None

    @property
    def backlog(self) -> int:
        return self.rounds_sent - self.rounds_taken

    async def gate(self, deliver, last_round_at: float) -> None:
        """Wait until the next chunk may be delivered (client caught up, not paused or a step granted, speed)."""
        while not self.stopping:
            p = self.pacing
            if self.backlog >= self.max_backlog:
                why = "client"
            elif p.paused and self.steps_used >= p.steps_granted:
                why = "paused"
            elif p.speed is not None and anyio.current_time() < last_round_at + 1.0 / p.speed:
                why = "speed"
            else:
                if p.paused:
                    self.steps_used += 1
                self.held = None
                return
            if why != self.held:
                self.held = why
                if why == "paused":
                    deliver(PARKED)
            await anyio.sleep(HOLD_POLL_S)


class ExternalRelay:
    """What every run on an external engine shares, for the app's life: one HTTP client (its connections to each
    server kept alive: no connection, TLS context or pool per run) and, per engine with a metrics URL, one
    reading of its /metrics (server_metrics.SharedScrapes: 16 runs at once read it once a second, not 16 times)."""

    def __init__(self):
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scrapes: dict[str, SharedScrapes] = {}

    @property
    def client(self) -> httpx.AsyncClient:
        """Made on the event loop where its connections live (an app served again on another loop, as tests
        do, gets a new one)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop, self._scrapes = httpx.AsyncClient(
                trust_env=False, follow_redirects=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)), loop, {}
        return self._client

    def scrapes(self, engine: ExternalEngine) -> SharedScrapes | None:
        if not engine.metrics_url:
            return None
        client = self.client
        if engine.name not in self._scrapes:
            self._scrapes[engine.name] = SharedScrapes(engine, client)
        return self._scrapes[engine.name]

    async def aclose(self) -> None:
        for scrapes in self._scrapes.values():
            await scrapes.aclose()
        self._scrapes = {}
        if self._client is not None:
            await self._client.aclose()
            self._client = None


async def run_external(session: ExternalSession, link: ExternalLink, deliver, relay: ExternalRelay) -> None:
    """Stream the generation; deliver each chunk's events (ending with metrics, done or error) as one batch.
    The engine's /metrics (if configured) are read before the run, every POLL_S while it runs (shared with the
    engine's other runs) and go with each metrics event as `server_metrics`; `done` adds how much its counters
    moved during the run (read again after it).
    A stop closes the HTTP stream at once (the server stops generating) and ends the run with `done`,
    finish_reason "cancelled", with the figures of what was delivered."""
    engine = session.engine
    pending: list = []
    texts: list[str] = []
    figures: dict = {"num_output_tokens": 0, "elapsed_s": 0.0}
    last_round_at = -1e9
    scrapes = relay.scrapes(engine)
    before = await scrapes.fresh() if scrapes is not None else {}
    with session.scope:
        async with (scrapes.watching() if before else nullcontext()), \
                aclosing(stream_chat(engine, session.prompt, session.settings, relay.client)) as events:
            async for event in events:
                pending.append(event)
                if event.type not in ("started", "metrics", "done", "error"):
                    continue
                if event.type == "metrics":
                    await link.gate(deliver, last_round_at)
                    last_round_at = anyio.current_time()
                    figures = event.values
                    if before:            # the gauges: the last values read (a dict no one changes)
                        event.values["server_metrics"] = scrapes.latest
                if event.type == "done" and before:
                    after = await scrapes.fresh()
                    event.summary["server_metrics"] = after
                    event.summary["server_metrics_moved"] = {k: v - before[k] for k, v in after.items()
                                                             if k.endswith("_total") and k in before}
                texts += [e.text for e in pending if e.type == "token"]
                batch, pending = pending, []
                link.rounds_sent += 1
                deliver(batch)
    if session.scope.cancel_called:
        deliver([Done({**figures, "finish_reason": "cancelled", "text": "".join(texts), "model": engine.describe()})])


async def start_external(conn, engine: ExternalEngine, prompt: str | None, settings: dict, paused: bool) -> None:
    """`Connection.start` for a configured external engine: validate, then run it in the connection's task
    group, with a slot of the same admission control as our own generations."""
    validated(prompt, settings)                      # raises SettingsError: answered, nothing started
    state = engine.description.get("state")         # a server this app starts (vLLM): ready, or why not
    if state not in (None, "ready"):
        why = engine.description.get("error") or "it is starting (its start-up takes about half a minute)"
        raise CommandError(f"{engine.name} is {state}, not ready: {why}", "model")
    await conn.end_run()
    session = ExternalSession(engine, prompt, dict(settings))
    run = conn.run = Run(next_run_id(), session, sent_settings=dict(settings))
    conn.pace.paused = paused
    run.link = ExternalLink(session, conn.pace, OUTBOX_MAX_BATCHES)
    if conn.room is not None:
        conn.room.run_started(run)

    async def generate() -> None:
        await run_external(session, run.link, lambda item: conn.deliver(run, item), conn.playground.relay)

    async def release() -> None:
        session.close()

    await conn.socket.tasks.start(conn.run_admitted, run, generate, release, session.described())
