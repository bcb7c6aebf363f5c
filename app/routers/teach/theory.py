"""`GET /teach/curve.json`: this machine's measured verify-cost curve t(n) of a model and its draft's step
(engine/measure.py), measured once per model as an engine job; the Theory and Cost views read it."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import CURVES, BusyError, model_of, run_job
from engine.measure import verify_cost_steps

router = APIRouter()
_curves: dict[str, dict] = {}


async def verify_cost(playground, model_name: str | None) -> dict:
    """The curve of a model (KeyError: no such model; BusyError: another curve is being measured)."""
    lm = playground.engine.registry.get(model_name)
    if lm.name not in _curves:
        _curves[lm.name] = await run_job(playground, verify_cost_steps(playground.engine.registry, lm), CURVES)
    return _curves[lm.name]


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
