"""`GET /healthz`: 200 `{"status": "ok"}` while the server can serve (Docker's HEALTHCHECK asks it);
503 if the engine thread has died (generations could no longer run)."""
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import PlaygroundDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(playground: PlaygroundDep):
    thread = playground.engine_thread
    if thread is not None and not thread.alive:
        return JSONResponse({"status": "error", "reason": "engine thread stopped"}, status_code=503)
    return {"status": "ok"}
