"""A small JSON API: the models this server has loaded, and what it is doing now (sessions, KV blocks)."""

from fastapi import APIRouter

from app.deps import PlaygroundDep

router = APIRouter(prefix="/api", tags=["api"])


@router.get("/models")
def models(playground: PlaygroundDep) -> dict:
    return {"models": playground.models(), "error": playground.load_error}


@router.get("/stats")
def stats(playground: PlaygroundDep) -> dict:
    """`sessions` generating (holding a slot), `waiting` for one, `connections` (presenters), `watchers`,
    `kv_blocks_used` / `kv_blocks_total` over all pools and per pool (`pools`); a block counts as used while a
    sequence references it (cached free blocks are not used)."""
    return playground.stats()
