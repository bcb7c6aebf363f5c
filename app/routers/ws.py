"""The websocket endpoints: `/ws` speaks HTML fragments to htmx, `/api/ws` JSON to programs.

Both check the Origin header before accepting (a refused handshake is an HTTP 403), then refuse politely
when the server already holds `max_connections` websockets (close 1013: htmx retries with backoff), and
hand the connection to `app.ws.connection.Connection` with their view. `?key=` (16-64 characters of
A-Z a-z 0-9 _ -) names the presenter's session for watch mode (app/watch/rooms.py); without one a fresh key is
made. The key is also the session whose earlier runs suffix decoding drafts from under `serve --suffix-cache
session`. docs/protocol.md has the vocabulary.
"""

import logging
from contextlib import nullcontext

from fastapi import APIRouter, WebSocket, WebSocketException, status

from app.deps import get_playground
from app.logs import log_event
from app.security import origin_allowed
from app.watch.rooms import KEY_RE, new_key
from app.ws.connection import Connection

logger = logging.getLogger(__name__)
router = APIRouter(tags=["websockets"])


def check_origin(websocket: WebSocket) -> None:
    """Accept the app's own origin and the configured ones, compared exactly; refuse others with 403."""
    if not origin_allowed(websocket, get_playground(websocket).config.allowed_origins):
        log_event(logger, "ws_refused", logging.WARNING, reason="origin", path=websocket.url.path,
                  origin=websocket.headers.get("origin", "")[:100])
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason="origin not allowed")


def presenter_key(websocket: WebSocket) -> str:
    key = websocket.query_params.get("key")
    if key is None:
        return new_key()
    if not KEY_RE.fullmatch(key):
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION,
                                 reason="key: 16-64 characters of A-Z a-z 0-9 _ -")
    return key


async def accept(websocket: WebSocket) -> bool:
    """Accept the handshake; False (after a 1013 close) when the server holds all the websockets it may."""
    pg = get_playground(websocket)
    await websocket.accept()
    if pg.connections + pg.watchers >= pg.config.max_connections:
        log_event(logger, "ws_refused", logging.WARNING, reason="max_connections", path=websocket.url.path)
        await websocket.close(code=status.WS_1013_TRY_AGAIN_LATER,
                              reason=f"busy: {pg.config.max_connections} connections; retry in a moment")
        return False
    return True


@router.websocket("/ws")
async def html_ws(websocket: WebSocket) -> None:
    check_origin(websocket)
    key = presenter_key(websocket)
    if not await accept(websocket):
        return
    playground = get_playground(websocket)
    view = playground.view("html")
    conn = Connection(websocket, playground, view, speed=view.default_speed, key=key)
    conn.notice("hello")                          # the page's connection indicator
    with suffix_scope(playground, key):
        await conn.serve()


@router.websocket("/api/ws")
async def json_ws(websocket: WebSocket) -> None:
    check_origin(websocket)
    key = presenter_key(websocket)
    if not await accept(websocket):
        return
    playground = get_playground(websocket)
    view = playground.view("json")
    with suffix_scope(playground, key):
        await Connection(websocket, playground, view, speed=view.default_speed, key=key).serve()


def suffix_scope(playground, key: str):
    """The generations of a presenter key (a page, across its reconnects) are one session of suffix decoding's
    caches: with `serve --suffix-cache session` they draft only from each other (engine/spec_decode/suffix_caches.py)."""
    return playground.engine.suffix_caches.session_scope(key) if playground.engine is not None else nullcontext()
