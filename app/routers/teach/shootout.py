"""`POST /teach/shootout`: the shoot-out view. One prompt, every method the target supports, run one after
another on the engine (engine/experiments/shootout.py), as a table beside Spec-Bench's published acceptance lengths;
for the model vLLM serves, then our EAGLE head in vLLM (`serve --vllm`'s eagle server), or why it cannot answer.

`GET /teach/plain.json?recording=KEY`: the Theory view's measured speed-up. A recorded run's prompt and settings
against plain decoding of the same, by the one comparison method (engine/experiments/compare.py: interleaved,
repeated, on the runs' engine clocks), as the Race and the Shoot-out measure; beside it the page's run's own
engine time per token. Figures from isolated timings (t(1) of the curve) the view labels "estimated"."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import RUNS, BusyError, fragment, on_engine_thread, run_job, teaching_run
from app.views.recording import RECORDINGS
from engine.experiments.compare import against_plain_figures, against_plain_steps
from engine.experiments.shootout import shootout_steps, vllm_row
from engine.serving.settings import GenerationSettings, SettingsError

router = APIRouter()
SHOOTOUT_MAX_TOKENS = 64     # five whole runs of a large model; the table needs a few dozen rounds, not more


@router.post("/shootout", response_class=HTMLResponse)
async def shootout_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    async def run(prompt: str, settings: dict, fields: dict) -> HTMLResponse:
        fleet = playground.vllm
        with RUNS.taken():                  # vLLM's run after ours, not beside it: two cores
            r = await on_engine_thread(playground, shootout_steps(playground.engine, prompt, settings))
            r["vllm"] = await vllm_row(r, prompt, fleet is not None, fleet.reason if fleet else None,
                                       fleet.server("eagle") if fleet else None)
        return fragment(request, "shootout", r=r, prompt=prompt)

    return await teaching_run(request, playground, SHOOTOUT_MAX_TOKENS, run)


_plain: dict[str, dict] = {}          # recording key -> its comparison with plain decoding (measured once)
PLAIN_MAX_TOKENS = 512                # as a race's


def measured_against_plain(recording: str) -> dict | None:
    """The measured speed-up of a recorded run's settings over plain decoding, if it has been measured."""
    return _plain.get(recording)


@router.get("/plain.json")
async def plain_json(playground: PlaygroundDep, recording: str = ""):
    rec = RECORDINGS.get(recording)
    done = rec.last("done") if rec is not None else None
    if done is None or playground.engine is None:
        return JSONResponse({"error": "no finished run with this key: run a generation first"}, status_code=404)
    if recording not in _plain:
        settings = {**rec.settings, "fault": "none"}
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, PLAIN_MAX_TOKENS)
        try:
            c = await run_job(playground, against_plain_steps(playground.engine, rec.prompt, settings), RUNS)
        except BusyError:
            return JSONResponse({"error": "another comparison is running: try again in a moment"}, status_code=503)
        except (SettingsError, ValueError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        run = done.summary
        _plain[recording] = {**against_plain_figures(c),
                             "page_ms_per_token": run["elapsed_s"] * 1e3 / max(1, run["num_output_tokens"])}
        while len(_plain) > 256:
            _plain.pop(next(iter(_plain)))
    return JSONResponse(_plain[recording])
