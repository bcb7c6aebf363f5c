"""`POST /teach/race`: the same prompt with one setting apart (engine/race.py, as an engine job), on their
engine clocks."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import RUNS, BusyError, error_fragment, fragment, run_job, settings_from
from engine.race import RACE_SETTINGS, race_steps
from engine.settings import GenerationSettings, SettingsError

router = APIRouter()
RACE_MAX_TOKENS = 512


@router.post("/race", response_class=HTMLResponse)
async def race_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    """`race` names the setting the two sides differ in, `race_a` and `race_b` its values (engine/race.py)."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        prompt, settings, fields = await settings_from(request)
        setting = fields.get("race") or "method"
        if setting not in RACE_SETTINGS:
            raise SettingsError("race", f"one of {', '.join(RACE_SETTINGS)}")
        values = (fields["race_a"], fields["race_b"]) if fields.get("race_a") and fields.get("race_b") else None
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, RACE_MAX_TOKENS)
        r = await run_job(playground, race_steps(playground.engine, prompt, settings, setting, values), RUNS)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison or race is running: try again in a moment.")
    return fragment(request, "race", r=r, prompt=prompt)
