"""The HTML pages: `/` is the playground, `/embed` the same page without chrome, for iframes.

Both take every setting, the prompt, `autoplay`, `speed`, `theme`, `hide` and `presenter` from the query
string (app/views/page.py). `/embed` may be framed by the configured frame ancestors (default: anyone); its
websocket still accepts only the app's own origin, which an iframe of ours has.

Each page gets a fresh presenter key in its websocket URL (a reconnect keeps it, so watchers keep
following) and the link for watchers, `/watch/{watch_id}` (app/watch/rooms.py); in workshop mode both carry the
token.
"""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.views.page import page_context
from app.routers import teach
from app.watch.rooms import new_key, watch_id_for
from app.security import FRAME_ANCESTORS_SELF, content_security_policy
from app.views.templating import templates
from app.urls import with_token

router = APIRouter(tags=["pages"])


@router.get("/", response_class=HTMLResponse)
def index(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(FRAME_ANCESTORS_SELF)}
    context = page_context(request.query_params, playground, embed=False)
    context.update(session_links(playground))
    return templates.TemplateResponse(request, "index.html", context, headers=headers)


@router.get("/embed", response_class=HTMLResponse)
def embed(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(playground.config.embed_frame_ancestors)}
    context = page_context(request.query_params, playground, embed=True)
    context.update(session_links(playground))
    return templates.TemplateResponse(request, "embed.html", context, headers=headers)


def session_links(playground) -> dict:
    """The page's websocket URL (with its presenter key) and the link that lets others watch it."""
    key = new_key()
    return {"ws_url": with_token("/ws", playground, key=key),
            "watch_url": with_token(f"/watch/{watch_id_for(key)}", playground),
            "embed_url": with_token("/embed", playground)}


# The teaching views' endpoints (/teach/...) belong to the page: its views load them (app/routers/teach/).
router.include_router(teach.router)
