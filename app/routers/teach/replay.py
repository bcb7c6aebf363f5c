"""`GET /teach/recordings/{key}.json` exports a run (settings and events); `POST /teach/replays` takes such a
file and answers with the page's messages for each of its rounds (app/views/replay.py).

A file is read, checked, rendered and its answer encoded in a process of its own (common.py's UPLOADS, a few at a
time, beyond them: 503), so that no upload holds the event loop or the GIL that the engine's thread needs; the
server then only makes the recording again from that process's parts, a few events at a time. The body itself is
at most 32 MiB (app/body_limits.py); it, and the answer, wait in a temporary folder."""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask

from app.routers.teach.common import UPLOADS, BusyError
from app.views.recording import RECORDINGS, Recording, RecordingError
from app.views.replay import ANSWER, UPLOAD, read_replay, recording_parts
from app.views.one_file_page import PageOptions, standalone_page

logger = logging.getLogger(__name__)
router = APIRouter()


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
    folder = Path(tempfile.mkdtemp(prefix="decoding-playground-upload-"))
    answer: Response | None = None
    try:
        with open(folder / UPLOAD, "wb") as upload:
            async for chunk in request.stream():
                upload.write(chunk)
        async with UPLOADS.turn():
            await UPLOADS.in_process(read_replay, str(folder), name)
            RECORDINGS.put(await anyio.to_thread.run_sync(Recording.from_parts, recording_parts(str(folder))))
        answer = FileResponse(folder / ANSWER, media_type="application/json",
                              background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))
        return answer
    except RecordingError as e:
        if getattr(e, "detail", None):
            logger.info("a replay failed: %s", e.detail)
        return JSONResponse({"error": f"cannot replay this file: {e}"}, status_code=400)
    except BusyError:
        return busy()
    except BrokenProcessPool:
        return JSONResponse({"error": "the process reading this file stopped; try again"}, status_code=503)
    finally:
        if answer is None:                 # (else the folder goes once the answer is sent)
            shutil.rmtree(folder, ignore_errors=True)
