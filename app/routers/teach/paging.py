"""`GET /teach/paging`: paging waste on the seed's request mix; `GET /teach/paging/live`: in the live pools
(read by an engine thread call, between two steps) and the recorded run's own sequence."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import fragment
from app.views.recording import RECORDINGS, Recording
from engine.experiments.traces import live_pools, paging_figures
from engine.kv.memory import paging_waste, seed_request_mix

router = APIRouter()

SEED_WASTE = {None: 0.472, 16: 0.007, 32: 0.014}


@router.get("/paging", response_class=HTMLResponse)
def paging(request: Request) -> HTMLResponse:
    lengths = seed_request_mix()
    rows = [{"block_size": b, "ours": paging_waste(lengths, b), "seed": SEED_WASTE.get(b)} for b in (None, 8, 16, 32)]
    sample = [int(x) for x in lengths[:24]]
    return fragment(request, "paging", rows=rows, sample=sample, n=len(lengths), low=int(lengths.min()),
                    high=int(lengths.max()), mean=float(lengths.mean()))


def run_paging(rec: Recording | None) -> dict | None:
    """The recorded run's own sequence at its last round: tokens held and the blocks they took."""
    if rec is None:
        return None
    kv, metrics = rec.last("kv"), rec.last("metrics")
    pool = next((p for p in (kv.pools if kv else []) if p.get("role") == "target"), None)
    if pool is None or metrics is None or not metrics.values.get("kv_bytes_per_token"):
        return None
    held = metrics.values["kv_cache_bytes"] // metrics.values["kv_bytes_per_token"]
    ctx = rec.started.model.get("max_position_embeddings") or 0
    return {**paging_figures([held], len(pool["block_table"]), pool["block_size"], ctx), "complete": rec.complete}


@router.get("/paging/live", response_class=HTMLResponse)
async def paging_live(request: Request, playground: PlaygroundDep, recording: str = "") -> HTMLResponse:
    pools = await playground.engine_thread.call(live_pools, playground.engine) if playground.engine_thread else []
    rec = RECORDINGS.get(recording) if recording else None
    return fragment(request, "paging_live", pools=pools, run=run_paging(rec))
