"""The websocket endpoints: `/ws` speaks HTML fragments to htmx, `/api/ws` JSON to programs.

Both check the Origin header before accepting (a refused handshake is an HTTP 403) and then hand the
connection to `app.connection.Connection` with their view. docs/protocol.md has the vocabulary.
"""

import logging

from fastapi import APIRouter, WebSocket, WebSocketException, status

from app.config import normalize_origin
from app.connection import Connection
from app.deps import get_playground
from app.html_view import HtmlView
from app.json_view import JsonView

logger = logging.getLogger(__name__)
router = APIRouter(tags=["websockets"])


def own_origin(websocket: WebSocket) -> str | None:
    """The origin this app is served from, as the client addressed it (scheme and Host header)."""
    host = websocket.headers.get("host")
    if not host:
        return None
    scheme = "https" if websocket.url.scheme in ("wss", "https") else "http"
    try:
        return normalize_origin(f"{scheme}://{host}")
    except ValueError:
        return None


def check_origin(websocket: WebSocket) -> None:
    """Accept the app's own origin and the configured ones, compared exactly; refuse others with 403.

    A client that sends no Origin at all is not a browser (browsers always send one with a websocket
    handshake), so no other site's page can be behind it: it is accepted.
    """
    origin = websocket.headers.get("origin")
    if origin is None:
        return
    try:
        origin = normalize_origin(origin)
    except ValueError:
        origin = None          # "null" (sandboxed frames, file://) and garbage
    allowed = set(get_playground(websocket).config.allowed_origins)
    own = own_origin(websocket)
    if own:
        allowed.add(own)
    if origin is None or origin not in allowed:
        logger.warning("websocket refused: origin %r is not allowed", websocket.headers.get("origin"))
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason="origin not allowed")


@router.websocket("/ws")
async def html_ws(websocket: WebSocket) -> None:
    check_origin(websocket)
    await websocket.accept()
    playground = get_playground(websocket)
    view = HtmlView(playground)
    conn = Connection(websocket, playground, view, speed=view.default_speed)
    view.hello(conn)
    await conn.serve()


@router.websocket("/api/ws")
async def json_ws(websocket: WebSocket) -> None:
    check_origin(websocket)
    await websocket.accept()
    playground = get_playground(websocket)
    await Connection(websocket, playground, JsonView(), speed=JsonView.default_speed).serve()
