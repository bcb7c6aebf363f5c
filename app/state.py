"""What the app holds for its lifetime: the configuration, the models, the engine and its thread.

`Playground` is created once in the FastAPI lifespan and reached through `get_playground` (deps);
`await playground.start()` starts the engine thread (it needs the running event loop), `await
playground.stop()` ends it after freeing every session's blocks.
NOTE (invariants): `admission.running` (= `sessions`) counts generations holding a slot, i.e. KV blocks or
the right to take them; a slot is given back only after the generation's blocks are freed.
`connections` counts open websockets of presenters, `watchers` those of read-only viewers.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from app.config import AppConfig
from app.curves import VerifyCurves
from app.logs import log_event
from app.metrics import ServerMetrics
from app.protocol import View
from app.views.frame import ViewSources
from app.views.html import HtmlView
from app.views.page import home_target
from app.views.json import JsonView
from app.watch.rooms import Rooms
from app.ws.admission import Admission
from app.ws.engine_thread import EngineThread
from app.ws.external import ExternalRelay, publish_server_config, start_embedded_llamacpp
from app.ws.vllm import VllmFleet
from engine.external.openai_stream import configured_engines
from engine.kv.cache import PoolSnapshot
from engine.model.checkpoint import CheckpointError
from engine.model.fetched import LazyModel
from engine.model.thread_choice import request_threads
from engine.serving.pools import human_bytes
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.scheduler import CHUNK_SECONDS

logger = logging.getLogger(__name__)


def freeze_start_up_objects() -> None:
    """What start-up made (modules, models, tokenizers) out of the cycle collector's sight: each of its full
    collections, which a stream of events triggers every few thousand tokens, would otherwise walk them all while
    it holds the event loop (docs/external-engines.md, "What watching an external engine costs"). They are
    still freed by reference counting; only a reference cycle among them would stay."""
    gc.collect()
    gc.freeze()
    log_event(logger, "gc_frozen", objects=gc.get_freeze_count())


@dataclass
class Playground:
    config: AppConfig
    engine: InferenceEngine | None = None
    load_error: str | None = None
    connections: int = 0
    engine_thread: EngineThread | None = None
    admission: Admission = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    rooms: Rooms | None = None
    external: dict = field(default_factory=dict)   # name -> ExternalEngine (app/ws/external.py)
    llamacpp: list = field(default_factory=list)   # the embedded llama.cpp servers that run
    vllm: VllmFleet | None = None                  # the vLLM servers (serve --vllm)
    relay: ExternalRelay = field(default_factory=ExternalRelay)   # the external runs' HTTP client and /metrics
    curves: VerifyCurves = field(default_factory=VerifyCurves)   # this machine's verify-cost curves
    _loop: asyncio.AbstractEventLoop | None = None
    _demo_target: str | None = None                 # the model whose curve `serve` measures at start-up
    _curve_waiting: object = None                   # it, loaded before the engine thread started
    _loading: set = field(default_factory=set)     # models being made ready in the background
    _stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        if self.admission is None:
            self.admission = Admission(self.config.max_sessions, self.config.max_queue)
        if self.rooms is None:
            self.rooms = Rooms(self.view)

    def view(self, kind: str) -> View:
        """A fresh view of a kind: html (the page) or json (programs)."""
        if kind == "html":
            return HtmlView(ViewSources(self.registry, self.external, self.pool_snapshots))
        return JsonView()

    @property
    def watchers(self) -> int:
        return self.rooms.watchers

    @classmethod
    def load(cls, config: AppConfig) -> "Playground":
        """Load the models once. A missing or broken model directory leaves the pages up, with the reason."""
        try:
            registry = ModelRegistry.from_dir(config.models_dir)
        except (FileNotFoundError, CheckpointError, KeyError, ValueError) as e:
            logger.error("no models loaded from %s: %s", config.models_dir, e)
            return cls(config, None, f"no models loaded from {config.models_dir}: {e}")
        engine = InferenceEngine(registry, max_sessions=config.max_sessions, kv_cache_memory=config.kv_cache_memory,
                                 suffix_cache=config.suffix_cache,
                                 suffix_max_tree_nodes=config.suffix_decoding_max_tree_nodes)
        how = "--kv-cache-memory; the pools made at start-up take %s" if config.kv_cache_memory is not None else \
            "the default: twice the %s of the pools made at start-up"
        logger.info("KV cache memory: %s for all pools (" + how + ")", human_bytes(engine.kv_cache_memory),
                    human_bytes(engine.default_pool_bytes))
        if engine.kv_cache_memory < engine.default_pool_bytes:
            logger.warning("--kv-cache-memory %s is less than the pools made at start-up take (%s): those left out "
                           "are not made, and requests that need them are refused",
                           human_bytes(engine.kv_cache_memory), human_bytes(engine.default_pool_bytes))
        return cls(config, engine)

    def loading(self) -> list[str]:
        """Fetched models still being made ready in the background (weights, heads, KV pools: `_warm_up`)."""
        return sorted(self._loading)

    def _warm_up(self) -> None:
        """At start-up, in the background, what would otherwise be paid inside a first request, a first token
        late by up to seconds: a fetched model's weights (SmolLM2: seconds), each target's heads and the KV pools
        of its defaults (engine.serving.registry.InferenceEngine.warm_up). A start that needs a model still loading waits
        for it (LazyModel's lock); the models already in memory go first."""
        targets = sorted(self.registry.targets, key=lambda m: m.name in self._loading)
        for lm in targets:
            if self._stopped.is_set():           # a short-lived app (tests): no loading after it ended
                self._loading.clear()
                return
            t = time.perf_counter()
            try:
                self.engine.warm_up(lm, self._stopped.is_set)
            except Exception:  # noqa: BLE001 - its first use will say why
                logger.exception("loading %s failed", lm.name)
            else:
                logger.info("%s ready in %.1f s", lm.name, time.perf_counter() - t)
                if self.config.curve_at_start and lm.name == self._demo_target:
                    self._loop.call_soon_threadsafe(self._measure_curve_at_start, lm)
            finally:
                self._loading.discard(lm.name)
        if self.config.freeze_gc and not self._stopped.is_set():
            freeze_start_up_objects()

    def _measure_curve_at_start(self, lm) -> None:
        """The demo model's verify curve, as a job that waits for an idle engine thread (app/curves.py)."""
        if self.engine_thread is None:
            self._curve_waiting = lm
        elif not self._stopped.is_set():
            self.curves.start(self, lm, patient=True)

    async def start(self) -> None:
        request_threads(self.config.threads, serving=True)   # applied when a model that streams from memory loads
        self._loop = asyncio.get_running_loop()
        if self.registry is not None:
            self._demo_target = home_target(self).name
            self._loading = {m.name for m in self.registry.targets      # what _warm_up loads (a draft: its first use)
                             if isinstance(m.model, LazyModel) and not m.model.loaded}
            threading.Thread(target=self._warm_up, name="warm-up", daemon=True).start()
        if not self.external:
            engines = configured_engines(self.config.openai_engines)
            if self.config.embedded_llamacpp:
                self.llamacpp = await asyncio.get_running_loop().run_in_executor(
                    None, start_embedded_llamacpp, self.config.llamacpp_threads)
                engines[:0] = [server.engine for server in self.llamacpp]
            await publish_server_config(engines)
            if self.config.vllm:
                self.vllm = VllmFleet(self.config.vllm_variants, self.config.vllm_threads,
                                      eager=not self.config.vllm_compile, port=self.config.vllm_port)
                engines += self.vllm.engines             # offered at once, each with its readiness
            ours = set(self.registry.models) if self.registry is not None else set()
            for e in engines:
                if e.name in ours or e.name in self.external:
                    logger.error("external engine %r not offered: the name is taken", e.name)
                else:
                    self.external[e.name] = e
            if self.vllm is not None:
                self.vllm.start()
        if self.engine is not None and self.engine_thread is None:
            budget = self.config.max_num_batched_tokens
            self.engine_thread = EngineThread(self.engine, self._loop, self.metrics,
                                              budget or None, None if budget == 0 else CHUNK_SECONDS)
            self.engine_thread.start()
            logger.info("engine thread started (BLAS threads: OPENBLAS_NUM_THREADS=%s; weight-product threads: %s)",
                        os.environ.get("OPENBLAS_NUM_THREADS"), self.config.threads or
                        "measured when a model that streams from memory loads")
            if self._curve_waiting is not None:
                self._measure_curve_at_start(self._curve_waiting)

    async def stop(self) -> None:
        self._stopped.set()
        if self.engine_thread is not None:
            await self.engine_thread.stop()
        for server in self.llamacpp:
            server.close()
        self.llamacpp = []
        await self.relay.aclose()
        if self.vllm is not None:
            await self.vllm.stop()

    @property
    def sessions(self) -> int:
        return self.admission.running

    @property
    def registry(self) -> ModelRegistry | None:
        return self.engine.registry if self.engine else None

    def pool_snapshots(self) -> list[PoolSnapshot]:
        """Every KV pool now, read without stopping the engine (a snapshot may be a step old)."""
        return self.engine.pool_snapshots() if self.engine is not None else []

    def stats(self) -> dict:
        pools = [p.stats() for p in self.pool_snapshots()]
        thread = self.engine_thread
        return {"sessions": self.sessions, "waiting": self.admission.waiting, "connections": self.connections,
                "watchers": self.watchers, "rooms": len(self.rooms.rooms) if self.rooms else 0,
                "max_sessions": self.config.max_sessions, "max_queue": self.config.max_queue,
                "kv_blocks_used": sum(p["used"] for p in pools),
                "kv_blocks_total": sum(p["num_blocks"] for p in pools), "pools": pools,
                "kv_pool_bytes": sum(p["bytes"] for p in pools),
                "kv_cache_memory": self.engine.kv_cache_memory if self.engine else None,
                "kv_pools_freed": self.engine.pools.freed if self.engine else 0,
                "kv_pools_refused": self.engine.pools.refused if self.engine else 0,
                "engine": {"alive": bool(thread and thread.alive), "scheduled": len(thread.links) if thread else 0,
                           "steps": thread.steps if thread else 0,
                           "posts": thread.posts if thread else 0,
                           "batches": thread.scheduler.batches if thread else 0,
                           "batched_requests": thread.scheduler.batched_requests if thread else 0,
                           "prefill_chunks": thread.scheduler.chunks if thread else 0,
                           "max_num_batched_tokens": thread.scheduler.max_num_batched_tokens if thread else None,
                           "prefill_chunk_ms": (thread.scheduler.chunk_seconds * 1e3
                                                if thread and thread.scheduler.chunk_seconds else None)}}

    def models(self) -> list[dict]:
        out, loading = [], self.loading()
        for m in (self.registry.models.values() if self.registry is not None else ()):
            d = m.describe() | {"loading": m.name in loading}
            if m.role == "target":
                d["kv_head_variants"] = sorted(self.registry.variants(m))
                draft = self.registry.draft_for(m)
                d["draft_model"] = draft.name if draft else None
            out.append(d)
        return out + [e.describe() for e in self.external.values()]
