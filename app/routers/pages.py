"""The HTML pages: `/` is the playground, `/embed` the same page without chrome, for iframes."""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.security import FRAME_ANCESTORS_ANY, FRAME_ANCESTORS_SELF, content_security_policy
from app.templating import templates

router = APIRouter(tags=["pages"])


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(FRAME_ANCESTORS_SELF)}
    return templates.TemplateResponse(request, "index.html", {}, headers=headers)


@router.get("/embed", response_class=HTMLResponse)
def embed(request: Request) -> HTMLResponse:
    headers = {"Content-Security-Policy": content_security_policy(FRAME_ANCESTORS_ANY)}
    return templates.TemplateResponse(request, "embed.html", {}, headers=headers)
