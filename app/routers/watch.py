"""Watch mode: `/watch/{watch_id}` is a read-only page following a presenter's session; its websocket is
`/watch/{watch_id}/ws` (HTML fragments), and `/api/watch/{watch_id}` is the JSON twin (the events of
`/api/ws`, preceded by `watching`, and `resync` before a fresh snapshot when a watcher fell behind).

A presenter's page links here (its watch id is in the link; app/watch/rooms.py). Watchers cost no engine work:
the presenter's events are rendered once per room and kind and sent to everyone.
"""

import logging

from fastapi import APIRouter, HTTPException, Request, WebSocket, WebSocketException, status
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep, get_playground
from app.views.page import page_context
from app.watch.rooms import WATCH_ID_RE
from app.watch.watcher import Watcher
from app.routers.ws import accept, check_origin
from app.security import content_security_policy
from app.views.templating import templates
from app.urls import with_token

logger = logging.getLogger(__name__)
router = APIRouter(tags=["watch"])
WATCH_HIDDEN = ("prompt", "presets", "controls", "settings")


def _watch_id(watch_id: str) -> str:
    if not WATCH_ID_RE.fullmatch(watch_id):
        raise HTTPException(status_code=404, detail="no such session: a watch id is 16 hex digits")
    return watch_id


@router.get("/watch/{watch_id}", response_class=HTMLResponse)
def watch_page(watch_id: str, request: Request, playground: PlaygroundDep) -> HTMLResponse:
    watch_id = _watch_id(watch_id)
    context = page_context(request.query_params, playground, embed=True)
    state = context["state"]
    state.hide = sorted(set(state.hide) | set(WATCH_HIDDEN))
    state.autoplay = False
    context.update(ws_url=with_token(f"/watch/{watch_id}/ws", playground), watching=watch_id)
    headers = {"Content-Security-Policy": content_security_policy(playground.config.embed_frame_ancestors)}
    return templates.TemplateResponse(request, "embed.html", context, headers=headers)


async def _serve_watcher(websocket: WebSocket, watch_id: str, kind: str) -> None:
    check_origin(websocket)
    if not WATCH_ID_RE.fullmatch(watch_id):
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason="a watch id is 16 hex digits")
    if not await accept(websocket):
        return
    playground = get_playground(websocket)
    await Watcher(websocket, playground.config, playground.rooms, kind, watch_id).serve()


@router.websocket("/watch/{watch_id}/ws")
async def watch_html_ws(websocket: WebSocket, watch_id: str) -> None:
    await _serve_watcher(websocket, watch_id, "html")


@router.websocket("/api/watch/{watch_id}")
async def watch_json_ws(websocket: WebSocket, watch_id: str) -> None:
    await _serve_watcher(websocket, watch_id, "json")
