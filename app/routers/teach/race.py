"""`POST /teach/race`: the same prompt with one setting apart (engine/experiments/race.py, as an engine job), on their
engine clocks."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import RUNS, fragment, on_engine_thread, run_job, teaching_run
from engine.experiments.race import race_steps
from engine.experiments.traces import trace_steps
from engine.external import engine_race
from engine.model.layout import weight_bytes

router = APIRouter()
RACE_MAX_TOKENS = 512


@router.post("/race", response_class=HTMLResponse)
async def race_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    """`race` names the setting the two sides differ in, `race_a` and `race_b` its values (engine/experiments/race.py)."""
    async def run(prompt: str, settings: dict, fields: dict) -> HTMLResponse:
        setting = fields.get("race") or "method"
        values = (fields["race_a"], fields["race_b"]) if fields.get("race_a") and fields.get("race_b") else None
        if setting == engine_race.SETTING:
            r = await race_engines(playground, prompt, settings, values)
        else:
            r = await run_job(playground, race_steps(playground.engine, prompt, settings, setting, values), RUNS)
        return fragment(request, "race", r=r, prompt=prompt)

    return await teaching_run(request, playground, RACE_MAX_TOKENS, run)


async def race_engines(playground, prompt: str, settings: dict, values) -> dict:
    """Our engine on the page's model, then a configured server, on the same prompt (engine/external/engine_race.py)."""
    _, name = engine_race.engine_pair(values, playground.external, settings.get("model"))
    lm = playground.engine.registry.get(settings.get("model") or None)
    ours_settings, sent = engine_race.race_settings(settings, getattr(lm.tokenizer, "chat_template", None) is not None)
    external = playground.external[name]
    with RUNS.taken():
        ours = await on_engine_thread(playground, trace_steps(playground.engine, prompt, ours_settings))
        theirs = await engine_race.external_trace(external, prompt, sent)
    ours_bytes = weight_bytes(lm.model)
    return engine_race.engine_race(ours, f"numpy · {lm.name} float32", ours_bytes, theirs, name,
                                   engine_race.their_weight_bytes(external, lm.name, ours_bytes))
