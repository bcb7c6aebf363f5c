"""`POST /teach/race`: the same prompt with one setting apart (engine/race.py, as an engine job), on their
engine clocks."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import (RUNS, BusyError, error_fragment, fragment, on_engine_thread, run_job,
                                      settings_from)
from engine import engine_race
from engine.layout import weight_bytes
from engine.race import RACE_SETTINGS, race_steps
from engine.settings import GenerationSettings, SettingsError
from engine.teaching import trace_steps

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
        if setting not in RACE_SETTINGS and setting != engine_race.SETTING:
            raise SettingsError("race", f"one of {', '.join([*RACE_SETTINGS, engine_race.SETTING])}")
        values = (fields["race_a"], fields["race_b"]) if fields.get("race_a") and fields.get("race_b") else None
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, RACE_MAX_TOKENS)
        if setting == engine_race.SETTING:
            r = await race_engines(playground, prompt, settings, values)
        else:
            r = await run_job(playground, race_steps(playground.engine, prompt, settings, setting, values), RUNS)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison or race is running: try again in a moment.")
    return fragment(request, "race", r=r, prompt=prompt)


async def race_engines(playground, prompt: str, settings: dict, values) -> dict:
    """Our engine on the page's model, then a configured server, on the same prompt (engine/engine_race.py)."""
    _, name = engine_race.engine_pair(values, playground.external)
    if settings.get("model") in playground.external:
        raise SettingsError("model", "a race of engines runs our side on one of our models: pick SmolLM2 "
                                     "(the weights llama.cpp serves) in the model selector")
    lm = playground.engine.registry.get(settings.get("model") or None)
    ours_settings, sent = engine_race.race_settings(settings, getattr(lm.tokenizer, "chat_template", None) is not None)
    external = playground.external[name]
    with RUNS.taken():
        ours = await on_engine_thread(playground, trace_steps(playground.engine, prompt, ours_settings))
        theirs = await engine_race.external_trace(external, prompt, sent)
    published = external.description.get("published") or {}
    return engine_race.engine_race(ours, f"numpy · {lm.name} float32", weight_bytes(lm.model), theirs, name,
                                   published.get("size"))
