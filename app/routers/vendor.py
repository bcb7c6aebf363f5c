"""Serves the pinned htmx files from node_modules, and nothing else from there (no CDN anywhere)."""

import logging

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from app.paths import VENDOR_FILES

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/static/vendor", tags=["static"])

_missing = [str(path) for path in VENDOR_FILES.values() if not path.is_file()]
if _missing:
    logger.error("front-end assets missing (run `npm ci` or `make setup`): %s", ", ".join(_missing))


@router.get("/{name}")
def vendor_file(name: str) -> FileResponse:
    path = VENDOR_FILES.get(name)
    if path is None or not path.is_file():
        raise HTTPException(status_code=404)
    return FileResponse(path, media_type="text/javascript; charset=utf-8")
