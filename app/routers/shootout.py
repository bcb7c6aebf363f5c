"""`POST /teach/shootout`: the shoot-out view. One prompt, every method the target supports, run one after
another on the engine (engine/shootout.py), as a table beside Spec-Bench's published acceptance lengths."""
from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach import BusyError, _settings_from, _teaching_run, error_fragment, fragment
from engine.settings import GenerationSettings, SettingsError
from engine.shootout import shootout

router = APIRouter(prefix="/teach", tags=["teach"])
SHOOTOUT_MAX_TOKENS = 64     # five whole runs of a large model; the table needs a few dozen rounds, not more


@router.post("/shootout", response_class=HTMLResponse)
async def shootout_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        prompt, settings, _ = await _settings_from(request)
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, SHOOTOUT_MAX_TOKENS)
        r = await anyio.to_thread.run_sync(_teaching_run, shootout, playground.engine, prompt, settings)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison, race or shoot-out is running: try again in a moment.")
    return fragment(request, "shootout", r=r, prompt=prompt)
