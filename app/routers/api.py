"""A small JSON API: the models this server has loaded, and how many sessions and KV blocks are in use."""

from fastapi import APIRouter

from app.deps import PlaygroundDep

router = APIRouter(prefix="/api", tags=["api"])


@router.get("/models")
def models(playground: PlaygroundDep) -> dict:
    return {"models": playground.models(), "error": playground.load_error}


@router.get("/stats")
def stats(playground: PlaygroundDep) -> dict:
    """`kv_blocks_used` counts blocks referenced by a sequence; cached free blocks are not used."""
    return playground.stats()
