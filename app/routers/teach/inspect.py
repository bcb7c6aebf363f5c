"""`GET /teach/inspect`: the token inspector for one token of a recorded run."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.routers.teach.common import error_fragment, fragment
from app.views.recording import RECORDINGS

router = APIRouter()


@router.get("/inspect", response_class=HTMLResponse)
def inspect(request: Request, recording: str, round: int, position: int, status: str,
            node: int | None = None) -> HTMLResponse:
    rec = RECORDINGS.get(recording)
    if rec is None:
        return error_fragment(request, "This run is no longer kept on the server (it keeps the most recent runs). "
                                       "Run it again, or replay its exported file.")
    settings = rec.settings
    ctx = {"round": round, "position": position, "status": status, "settings": settings,
           "greedy": settings.get("temperature", 0) == 0, "token": None, "draft_token": None, "replaced": None,
           "rejected": None}
    if status == "unverified":
        draft = rec.draft(round)
        if draft is None or not 1 <= position <= len(draft.tokens):
            return error_fragment(request, f"no draft token at round {round}, position {position}")
        ctx["draft_token"] = draft.tokens[position - 1]
    else:
        tok = rec.token(round, position, status, node)      # node: a token tree's draft (its draft lane chip)
        if tok is None:
            return error_fragment(request, f"no {status} token at round {round}, position {position}")
        ctx["token"] = tok
        if status == "rejected":
            ctx["replaced"] = rec.token(round, position, "resampled")
        if status == "resampled":
            ctx["rejected"] = rec.token(round, position, "rejected")
    return fragment(request, "inspector", **ctx)
