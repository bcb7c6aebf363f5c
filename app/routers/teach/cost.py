"""`GET /teach/cost`: the verify cost measured here beside a roofline projection for an accelerator
(engine/experiments/theory.py); every figure, and which measurement feeds it, is chosen in engine/: this only
reads the form and picks the chart's axis."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import error_fragment, fragment, model_of, number
from app.routers.teach.shootout import measured_against_plain
from app.routers.teach.theory import curve_note, recorded_rounds, verify_cost
from app.views.recording import RECORDINGS
from engine.experiments.measure import CURVE_NS
from engine.experiments.theory import (
    ACCELERATORS,
    accelerator_projections,
    cost_card_here,
    curve_ratios,
    expected_tokens_per_round,
    run_series,
)
from engine.kv.memory import PUBLIC_CONFIGS

router = APIRouter()

BATCHES = (1, 4, 16, 64, 256, 1024)
PROJECTION_DRAFT = "Llama-3.2-1B"


@router.get("/cost", response_class=HTMLResponse)
async def cost(request: Request, playground: PlaygroundDep, model: str = "", recording: str = "",
               accelerator: str = "H100-SXM", target: str = "Llama-3.1-8B", alpha: str = "", gamma: str = "",
               batch: str = "", context: str = "") -> HTMLResponse:
    """`alpha` defaults to the α of the page's run (`recording`), `gamma` to the tokens it drafted per round
    (rounded), else 0.8 and 4. The "here" card shows measurements only; the formula's results are "predicted":
    for the run with its own inputs (engine/experiments/theory.py's `run_series`), and for the form's α and γ."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    rec = RECORDINGS.get(recording) if recording else None
    points, method, _ = recorded_rounds(rec, None) if rec is not None else ([], None, [])
    try:
        here = await verify_cost(playground, model_of(recording, model))
    except KeyError as e:
        return error_fragment(request, str(e.args[0]))
    t1, ratio_here = curve_ratios(here)
    run = run_series(points, t1, ratio_here if here["physical"] else None, method)["summary"] if points else None
    drafting = run is not None and run["gamma"] is not None
    alpha = number(alpha, min(run["alpha"], 0.99) if drafting else 0.8, float, 0.0, 0.99)
    gamma = number(gamma, max(1, round(run["gamma"])) if drafting else 4, int, 1, 16)
    batch = number(batch, 1, int, 1, 4096)
    context = number(context, 512, int, 1, 131072)
    accelerator = accelerator if accelerator in ACCELERATORS else "H100-SXM"
    target = target if target in PUBLIC_CONFIGS and target != PROJECTION_DRAFT else "Llama-3.1-8B"
    card = cost_card_here(run, here, method, alpha, gamma)
    tcfg, dcfg = PUBLIC_CONFIGS[target], PUBLIC_CONFIGS[PROJECTION_DRAFT]
    projections = accelerator_projections(alpha, gamma, tcfg.parameters, tcfg.bytes_per_token(2, context),
                                          dcfg.parameters, dcfg.bytes_per_token(2, context), context, CURVE_NS,
                                          batch, BATCHES)
    chosen = next(p for p in projections if p["key"] == accelerator)
    return fragment(request, "cost", here=here, ratio_here=ratio_here, e=expected_tokens_per_round(alpha, gamma),
                    alpha=alpha, gamma=gamma, batch=batch, context=context, c_here=card["c"], c_of=card["of"], run=run,
                    what_if=card["what_if"], measured=measured_against_plain(recording), curve=curve_note(here),
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
