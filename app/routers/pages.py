"""The HTML pages: `/` is the playground, `/embed` the same page without chrome, for iframes.

Both take every setting, the prompt, `autoplay`, `speed`, `theme`, `hide` and `presenter` from the query
string (app/page.py). `/embed` may be framed by the configured frame ancestors (default: anyone); its
websocket still accepts only the app's own origin, which an iframe of ours has.
"""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.page import page_context
from app.routers import teach
from app.security import FRAME_ANCESTORS_SELF, content_security_policy
from app.templating import templates

router = APIRouter(tags=["pages"])


@router.get("/", response_class=HTMLResponse)
def index(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(FRAME_ANCESTORS_SELF)}
    context = page_context(request.query_params, playground, embed=False)
    return templates.TemplateResponse(request, "index.html", context, headers=headers)


@router.get("/embed", response_class=HTMLResponse)
def embed(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(playground.config.embed_frame_ancestors)}
    context = page_context(request.query_params, playground, embed=True)
    return templates.TemplateResponse(request, "embed.html", context, headers=headers)


# The teaching views' endpoints (/teach/...) belong to the page: its views load them (app/routers/teach.py).
router.include_router(teach.router)
