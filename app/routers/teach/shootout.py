"""`POST /teach/shootout`: the shoot-out view. One prompt, every method the target supports, run one after
another on the engine (engine/experiments/shootout.py), as a table beside Spec-Bench's published acceptance lengths.

`GET /teach/plain.json?recording=KEY`: the Theory view's measured speed-up. Plain decoding of a recorded run's
prompt with its settings, timed on the same engine (as the Race does); the run's engine time per token
against it. Figures from isolated timings (t(1), c on an idle engine) the view labels "estimated"."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import RUNS, BusyError, fragment, run_job, teaching_run
from app.views.recording import RECORDINGS
from engine.experiments.shootout import shootout_steps
from engine.experiments.traces import trace_steps
from engine.serving.settings import SettingsError

router = APIRouter()
SHOOTOUT_MAX_TOKENS = 64     # five whole runs of a large model; the table needs a few dozen rounds, not more


@router.post("/shootout", response_class=HTMLResponse)
async def shootout_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    async def run(prompt: str, settings: dict, fields: dict) -> HTMLResponse:
        r = await run_job(playground, shootout_steps(playground.engine, prompt, settings), RUNS)
        return fragment(request, "shootout", r=r, prompt=prompt)

    return await teaching_run(request, playground, SHOOTOUT_MAX_TOKENS, run)


_plain: dict[str, dict] = {}          # recording key -> its plain-decoding comparison (a run is timed once)


@router.get("/plain.json")
async def plain_json(playground: PlaygroundDep, recording: str = ""):
    rec = RECORDINGS.get(recording)
    done = rec.last("done") if rec is not None else None
    if done is None or playground.engine is None:
        return JSONResponse({"error": "no finished run with this key: run a generation first"}, status_code=404)
    if recording not in _plain:
        settings = {**rec.settings, "method": "none", "fault": "none"}
        try:
            plain = await run_job(playground, trace_steps(playground.engine, rec.prompt, settings), RUNS)
        except BusyError:
            return JSONResponse({"error": "another comparison is running: try again in a moment"}, status_code=503)
        except (SettingsError, ValueError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        run = done.summary
        plain_ms = plain["elapsed_ms"] / max(1, plain["num_output_tokens"])
        run_ms = run["elapsed_s"] * 1e3 / max(1, run["num_output_tokens"])
        _plain[recording] = {"plain_ms_per_token": plain_ms, "run_ms_per_token": run_ms, "measured": plain_ms / run_ms,
                             "same_text": plain["summary"] is not None and plain["summary"]["text"] == run["text"]}
        while len(_plain) > 256:
            _plain.pop(next(iter(_plain)))
    return JSONResponse(_plain[recording])
