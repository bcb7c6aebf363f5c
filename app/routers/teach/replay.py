"""`GET /teach/recordings/{key}.json` exports a run (settings and events); `POST /teach/replays` takes such a
file and answers with the page's messages for each of its rounds (app/views/replay.py)."""
from __future__ import annotations

import json
import logging
import time

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.views.json import dumps
from app.views.recording import RECORDINGS, Recording, RecordingError
from app.views.replay import render_replay
from app.views.standalone import PageOptions, standalone_page

logger = logging.getLogger(__name__)
router = APIRouter()
MAX_RECORDING_BYTES = 32 * 2 ** 20


@router.get("/recordings/{key}.json")
def export_recording(key: str) -> Response:
    rec = RECORDINGS.get(key)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(rec.created))
    return Response(dumps(rec.to_json()), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="decoding-playground-{stamp}-{key[:8]}.json"'})


@router.get("/recordings/{key}.html")
async def export_page(key: str, request: Request) -> Response:
    """The run as one self-contained page (app/views/standalone.py), looking as `layout`, `presenter`, `theme`,
    `hide`, `speed` and `autoplay` say (the page that asks passes its own)."""
    rec = RECORDINGS.get(key)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    try:
        options = PageOptions.from_query(request.query_params)
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    # rendering a long run's frames takes a while and reads no engine state: a worker thread does it
    html = await anyio.to_thread.run_sync(standalone_page, rec, options)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(rec.created))
    return Response(html, media_type="text/html; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="decoding-playground-{stamp}-{key[:8]}.html"'})


@router.post("/replays")
async def load_replay(request: Request) -> JSONResponse:
    """The body is a recording file; the answer holds the page's messages for each of its rounds."""
    body = await request.body()
    if len(body) > MAX_RECORDING_BYTES:
        return JSONResponse({"error": f"file too large: at most {MAX_RECORDING_BYTES // 2 ** 20} MiB"}, status_code=413)
    try:
        data = json.loads(body)
        name = (request.headers.get("x-file-name") or "")[:120] or None
        rec = Recording.from_json(data, name=name)
    except (ValueError, RecordingError) as e:
        return JSONResponse({"error": f"cannot replay this file: {e}"}, status_code=400)
    try:
        frames = await render_replay(rec)
    except Exception as e:  # noqa: BLE001 - a file with events of the right names but wrong contents
        logger.info("replay of %s failed: %s: %s", rec.key, type(e).__name__, e)
        return JSONResponse({"error": f"cannot replay this file: its events do not render ({type(e).__name__})"},
                            status_code=400)
    rec = RECORDINGS.put(rec)
    started = rec.started
    return JSONResponse({"key": rec.key, "name": rec.name, "frames": frames, "rounds": rec.num_rounds,
                         "complete": rec.complete, "settings": rec.settings,
                         "model": started.model.get("name") if started else None})
