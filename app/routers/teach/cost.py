"""`GET /teach/cost`: the verify cost measured here beside a roofline projection for an accelerator
(engine/experiments/theory.py); every figure is computed there, this only reads the form and picks the chart's axis."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import BusyError, error_fragment, fragment, model_of, number
from app.routers.teach.theory import recorded_rounds, verify_cost
from app.views.recording import RECORDINGS
from engine.experiments.measure import CURVE_NS
from engine.experiments.theory import (
    ACCELERATORS,
    accelerator_projections,
    expected_tokens_per_round,
    run_alpha,
    run_series,
    speedup_from_curve,
)
from engine.kv.memory import PUBLIC_CONFIGS

router = APIRouter()

BATCHES = (1, 4, 16, 64, 256, 1024)
PROJECTION_DRAFT = "Llama-3.2-1B"


@router.get("/cost", response_class=HTMLResponse)
async def cost(request: Request, playground: PlaygroundDep, model: str = "", recording: str = "",
               accelerator: str = "H100-SXM", target: str = "Llama-3.1-8B", alpha: str = "", gamma: str = "",
               batch: str = "", context: str = "") -> HTMLResponse:
    """`alpha` defaults to the α of the page's run (`recording`), `gamma` to the page's γ (static/teach.js fills
    it in), else 0.8 and 4."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    rec = RECORDINGS.get(recording) if recording else None
    points, method = recorded_rounds(rec, None) if rec is not None else ([], None)
    run = run_alpha(points) if points and not alpha.strip() else None
    alpha = number(alpha, 0.8 if run is None else min(run, 0.99), float, 0.0, 0.99)
    gamma = number(gamma, 4, int, 1, 16)
    batch = number(batch, 1, int, 1, 4096)
    context = number(context, 512, int, 1, 131072)
    accelerator = accelerator if accelerator in ACCELERATORS else "H100-SXM"
    target = target if target in PUBLIC_CONFIGS and target != PROJECTION_DRAFT else "Llama-3.1-8B"
    try:
        here = await verify_cost(playground, model_of(recording, model))
    except KeyError as e:
        return error_fragment(request, str(e.args[0]))
    except BusyError:
        return error_fragment(request, "Another verify-cost curve is being measured: try again in a moment.")
    t1 = here["target_ms"][1]
    ratio_here = {n: ms / t1 for n, ms in here["target_ms"].items()}
    e = expected_tokens_per_round(alpha, gamma)
    # a head's or n-gram's c is its proposals' time in the page's run; the draft model's is measured beside t(1)
    run_c = (run_series(points, t1, ratio_here, None, method)["summary"]["c"]
             if method not in (None, "none", "draft_model") else None)
    c_here, c_of = (run_c, f"{method}, measured in the page's run") if run_c is not None else (
        here["c"] or 0.0, f"draft model {here['draft']}" if here["draft"] else "no drafter measured")
    tcfg, dcfg = PUBLIC_CONFIGS[target], PUBLIC_CONFIGS[PROJECTION_DRAFT]
    projections = accelerator_projections(alpha, gamma, tcfg.parameters, tcfg.bytes_per_token(2, context),
                                          dcfg.parameters, dcfg.bytes_per_token(2, context), context, CURVE_NS,
                                          batch, BATCHES)
    chosen = next(p for p in projections if p["key"] == accelerator)
    return fragment(request, "cost", here=here, ratio_here=ratio_here, e=e, alpha=alpha, gamma=gamma, batch=batch,
                    context=context, c_here=c_here, c_of=c_of,
                    speedup_here=speedup_from_curve(alpha, gamma, c_here, ratio_here[gamma + 1]),
                    projections=projections, chosen=chosen, accelerator=accelerator, accelerators=ACCELERATORS,
                    target=target, targets=[n for n in PUBLIC_CONFIGS if n != PROJECTION_DRAFT],
                    draft_name=PROJECTION_DRAFT, batches=BATCHES, ns=CURVE_NS,
                    **y_axis(max(max(ratio_here.values()), *(max(p["curve"].values()) for p in projections))))


def y_axis(top: float) -> dict:
    """A chart's maximum and ticks in round numbers (1, 2 or 5 times a power of ten apart)."""
    for step in (0.5, 1, 2, 5, 10, 20, 50):
        if top * 1.08 / step <= 5:
            break
    ymax = step * -(-top * 1.08 // step)
    ticks = [step * i for i in range(1, int(ymax / step) + 1)]
    return {"ymax": ymax, "yticks": ticks if 1 in ticks else [1, *ticks]}
