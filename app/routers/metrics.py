"""`GET /metrics`: Prometheus text format, vLLM's names where one exists (app/metrics.py lists them)."""

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from app.deps import PlaygroundDep
from app.metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


def scrape_gauges(pg) -> list[tuple]:
    """(name, type, help, labels, value) rows read now: sessions, KV pools, connections, the engine thread."""
    rows = [
        ("vllm:num_requests_running", "gauge", "Generations holding a slot (running or paused).", {}, pg.sessions),
        ("vllm:num_requests_waiting", "gauge", "Generations waiting for a slot.", {}, pg.admission.waiting),
    ]
    pools = pg.pool_snapshots()
    for p in pools:
        labels = {"model_name": p.name.split(":", 1)[-1], "pool": p.name, "kv_cache_dtype": p.kv_cache_dtype,
                  "block_size": p.block_size}
        rows.append(("vllm:kv_cache_usage_perc", "gauge", "Fraction of the pool's KV blocks in use (0..1).", labels,
                     p.used / p.num_blocks if p.num_blocks else 0.0))
    for p in pools:
        labels = {"pool": p.name, "kv_cache_dtype": p.kv_cache_dtype, "block_size": p.block_size}
        rows.append(("playground_kv_blocks_used", "gauge", "KV blocks referenced by a sequence.", labels, p.used))
    for p in pools:
        labels = {"pool": p.name, "kv_cache_dtype": p.kv_cache_dtype, "block_size": p.block_size}
        rows.append(("playground_kv_blocks_total", "gauge", "KV blocks in the pool.", labels, p.num_blocks))
    for p in pools:
        labels = {"pool": p.name, "kv_cache_dtype": p.kv_cache_dtype, "block_size": p.block_size}
        rows.append(("playground_kv_pool_bytes", "gauge", "K/V memory the pool holds (all its blocks).", labels,
                     p.nbytes))
    if pg.engine is not None:
        rows += [
            ("playground_kv_cache_memory_bytes", "gauge", "What all KV pools may hold together (--kv-cache-memory).",
             {}, pg.engine.kv_cache_memory),
            ("playground_kv_pools_freed", "counter", "Idle KV pools freed to make room for another.", {},
             pg.engine.pools.freed),
            ("playground_kv_pools_refused", "counter", "Requests refused: their KV pool did not fit the memory.", {},
             pg.engine.pools.refused),
        ]
        rows += suffix_gauges(pg.engine.suffix_caches)
    thread = pg.engine_thread
    rows += [
        ("playground_max_sessions", "gauge", "Generations allowed at once (--max-sessions).", {},
         pg.config.max_sessions),
        ("playground_websocket_connections", "gauge", "Open presenter websockets.", {}, pg.connections),
        ("playground_watchers", "gauge", "Open watcher websockets.", {}, pg.watchers),
        ("playground_rooms", "gauge", "Presenter sessions that watchers can follow.", {},
         len(pg.rooms.rooms) if pg.rooms else 0),
        ("playground_admission_refused", "counter", "Starts refused because slots and line were full.", {},
         pg.admission.refused),
        ("playground_engine_steps", "counter", "Scheduler steps that ran engine work.", {},
         thread.steps if thread else 0),
        ("playground_engine_busy_seconds", "counter", "Time the engine thread spent in those steps.", {},
         thread.busy_s if thread else 0.0),
        ("playground_engine_posts", "counter", "Deliveries of engine events to the event loop (each wakes it).",
         {}, thread.posts if thread else 0),
        ("playground_engine_batches", "counter", "Batched forward computations (several sessions in one).", {},
         thread.scheduler.batches if thread else 0),
        ("playground_engine_batched_requests", "counter", "Forward requests served by batched computations.", {},
         thread.scheduler.batched_requests if thread else 0),
    ]
    return rows


def suffix_gauges(caches) -> list[tuple]:
    """Suffix decoding's global trees: their size per model (every tree shape and session), and their bound."""
    rows = [("playground_suffix_decoding_max_tree_nodes", "gauge",
             "Bound on the nodes plus cached responses of all suffix decoding global trees.", {}, caches.max_tree_nodes)]
    sizes = caches.sizes()
    for model, size in sizes.items():
        rows.append(("playground_suffix_decoding_tree_nodes", "gauge", "Nodes of the model's suffix decoding global "
                     "trees.", {"model_name": model}, size["nodes"]))
    for model, size in sizes.items():
        rows.append(("playground_suffix_decoding_cached_requests", "gauge", "Responses held in the model's suffix "
                     "decoding global trees.", {"model_name": model}, size["cached_requests"]))
    return rows


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(playground: PlaygroundDep) -> PlainTextResponse:
    return PlainTextResponse(playground.metrics.render(scrape_gauges(playground)), media_type=CONTENT_TYPE)
