"""`GET /teach/recordings/{key}.json` exports a run (settings and events); `POST /teach/replays` takes such a
file and answers with the page's messages for each of its rounds (app/views/replay.py).

A file is read, checked, rendered and its answer encoded in a worker thread, a few at a time (common.py's
UPLOADS, beyond them: 503), so that no upload holds the event loop; the body itself is at most 32 MiB
(app/body_limits.py)."""
from __future__ import annotations

import logging
import tempfile
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from app.routers.teach.common import UPLOADS, BusyError
from app.views.json import dumps
from app.views.recording import RECORDINGS, Recording, RecordingError
from app.views.replay import frames_json, replay_frames
from app.views.one_file_page import PageOptions, standalone_page

logger = logging.getLogger(__name__)
router = APIRouter()
# An upload is kept in memory up to this, the rest in a temporary file until it is read: a room of uploads in
# flight (each up to 32 MiB, app/body_limits.py) costs the server's memory little.
SPOOL_BYTES = 1 << 20


def busy() -> JSONResponse:
    return JSONResponse({"error": f"busy: {UPLOADS.running} recordings are being read or rendered; try again "
                                  "in a moment"}, status_code=503, headers={"Retry-After": "2"})


@router.get("/recordings/{key}.json")
async def export_recording(key: str) -> Response:
    rec = RECORDINGS.get(key)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    try:
        body = await UPLOADS.run(rec.to_json_bytes)
    except BusyError:
        return busy()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(rec.created))
    return Response(body, media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="decoding-playground-{stamp}-{key[:8]}.json"'})


@router.get("/recordings/{key}.html")
async def export_page(key: str, request: Request) -> Response:
    """The run as one self-contained page (app/views/one_file_page.py), looking as `layout`, `presenter`, `theme`,
    `hide`, `speed` and `autoplay` say (the page that asks passes its own)."""
    rec = RECORDINGS.get(key)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    try:
        options = PageOptions.from_query(request.query_params)
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    try:
        html = await UPLOADS.run(standalone_page, rec, options)
    except BusyError:
        return busy()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(rec.created))
    return Response(html, media_type="text/html; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="decoding-playground-{stamp}-{key[:8]}.html"'})


@router.post("/replays")
async def load_replay(request: Request) -> Response:
    """The body is a recording file; the answer holds the page's messages for each of its rounds."""
    name = (request.headers.get("x-file-name") or "")[:120] or None
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as spool:
        async for chunk in request.stream():
            spool.write(chunk)
        try:
            return Response(await UPLOADS.run(replay_answer, spool, name), media_type="application/json")
        except RecordingError as e:
            return JSONResponse({"error": f"cannot replay this file: {e}"}, status_code=400)
        except BusyError:
            return busy()


def replay_answer(spool, name: str | None) -> bytes:
    """(In a worker thread.) The file read and checked, its frames rendered, the recording kept, the answer as
    JSON bytes: `{key, name, rounds, complete, settings, model, frames}`."""
    spool.seek(0)
    rec = Recording.read(iter(lambda: spool.read(SPOOL_BYTES), b""), name)
    try:
        frames = replay_frames(rec)
    except Exception as e:  # noqa: BLE001 - a file with events of the right kinds but wrong contents inside them
        logger.info("replay of %s failed: %s: %s", rec.key, type(e).__name__, e)
        raise RecordingError(f"its events do not render ({type(e).__name__})") from None
    rec = RECORDINGS.put(rec)
    started = rec.started
    head = dumps({"key": rec.key, "name": rec.name, "rounds": rec.num_rounds, "complete": rec.complete,
                  "settings": rec.settings, "model": started.model.get("name") if started else None})
    pieces = [head[:-1], ',"frames":', *frames_json(frames), "}"]
    return b"".join(piece.encode("utf-8", "replace") for piece in pieces)
