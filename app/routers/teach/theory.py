"""The Theory view's figures, all computed here (static/teach.js only draws them):

- `GET /teach/curve.json`: this machine's measured verify-cost curve t(n) of a model and its draft's step
  (engine/experiments/measure.py), measured once per model as an engine job; the Cost view uses it too;
- `GET /teach/theory.json?recording=KEY&rounds=N`: a run's first N rounds against the formulas
  (engine/experiments/theory.py's `run_series`), with that curve's t(1), t(n)/t(1) and c."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import CURVES, BusyError, model_of, run_job
from app.views.recording import RECORDINGS
from engine.experiments.measure import verify_cost_steps
from engine.experiments.theory import RoundPoint, run_series
from engine.model.threads import threads

router = APIRouter()
_curves: dict[tuple[str, int], dict] = {}     # (model, weight-product threads): the curve follows the thread count
MAX_ROUNDS = 4096            # the charts show at most the last this many rounds


async def verify_cost(playground, model_name: str | None) -> dict:
    """The curve of a model (KeyError: no such model; BusyError: another curve is being measured)."""
    lm = playground.engine.registry.get(model_name)
    key = (lm.name, threads())
    if key not in _curves:
        _curves[key] = await run_job(playground, verify_cost_steps(playground.engine.registry, lm), CURVES)
    return _curves[key]


@router.get("/curve.json")
async def curve_json(playground: PlaygroundDep, model: str | None = None, recording: str | None = None):
    if playground.engine is None:
        return JSONResponse({"error": playground.load_error or "no models loaded"}, status_code=503)
    try:
        return JSONResponse(await verify_cost(playground, model_of(recording, model)))
    except KeyError as e:
        return JSONResponse({"error": str(e.args[0])}, status_code=404)
    except BusyError:
        return JSONResponse({"error": "busy: another curve is being measured; try again in a moment"},
                            status_code=503)


def recorded_rounds(rec, rounds: int | None) -> tuple[list[RoundPoint], str]:
    """The first `rounds` rounds of a recording (all: None), and the drafter of the last of them."""
    points, method = [], rec.settings.get("method") or "none"
    for e in list(rec.events):
        if rounds is not None and len(points) >= rounds:
            break
        if e.type == "draft":
            method = e.method
        elif e.type == "round":
            points.append(RoundPoint(e.target_ms, e.draft_ms, e.num_emitted, e.num_draft_tokens, e.num_accepted))
    return points[-MAX_ROUNDS:], method


@router.get("/theory.json")
async def theory_json(playground: PlaygroundDep, recording: str = "", rounds: int | None = None):
    rec = RECORDINGS.get(recording)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    points, method = recorded_rounds(rec, rounds)
    curve = None
    if playground.engine is not None:
        try:
            curve = await verify_cost(playground, model_of(recording, None))
        except (KeyError, BusyError):     # a model no longer served; a curve being measured: figures without it
            curve = None
    t1 = curve["target_ms"][1] if curve else None
    ratios = {n: ms / t1 for n, ms in curve["target_ms"].items()} if curve else None
    series = run_series(points, t1, ratios, curve["c"] if curve else None, method)
    return JSONResponse({**series, "model": curve["model"] if curve else None, "measured_curve": curve is not None})
