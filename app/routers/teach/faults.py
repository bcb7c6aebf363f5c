"""`POST /teach/faults`: a teaching fault beside a correct run, with the point of divergence
(engine/experiments/traces.py, as an engine job)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import RUNS, fragment, run_job, teaching_run
from engine.experiments.traces import fault_comparison_steps
from engine.serving.settings import FAULTS, SettingsError

router = APIRouter()
FAULT_MAX_TOKENS = 64

FAULT_TEXT = {
    "no_causal_mask": {
        "title": "No causal mask in verification",
        "seed": "no causal mask in verify -> max|logit diff| 0.982, argmax same False",
        "why": "Verification feeds the last token and the γ draft tokens through the target in one forward. "
               "Without the causal mask, position i also attends to the draft tokens after it: the target's "
               "distribution at each position is computed from the future, so acceptance is decided on the wrong "
               "p. Greedy speculative decoding should equal plain greedy decoding token for token; with this fault "
               "it parts from it."},
    "no_truncate": {
        "title": "Forgetting to truncate the cache",
        "seed": "forgot truncate -> same as reference: False, first diff at 4",
        "why": "After a rejection, the K/V the target wrote for the rejected draft tokens must be dropped: "
               "truncate the cache (here: the block table) to the accepted length. Kept, they sit in the cache "
               "as if they were part of the text; every later token attends to them, and positions shift."},
    "unnormalized_residual": {
        "title": "Unnormalised residual",
        "seed": "unnormalized p -> ValueError: Probabilities do not sum to 1.",
        "why": "After a rejection, the replacement is drawn from max(0, p − q), which must be normalised to "
               "sum to 1. Without it, numpy refuses at the first rejection — the error the first seed hit while "
               "writing its experiment. (It needs sampling: greedy verification never draws from the residual.)"},
}


@router.post("/faults", response_class=HTMLResponse)
async def faults(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    async def run(prompt: str, settings: dict, fields: dict) -> HTMLResponse:
        fault = fields.get("fault", "")
        if fault not in FAULTS or fault == "none":
            raise SettingsError("fault", f"one of {', '.join(FAULT_TEXT)}")
        r = await run_job(playground, fault_comparison_steps(playground.engine, prompt, settings, fault), RUNS)
        emitted = {role: [t for t in r[role]["tokens"] if t["status"] != "rejected"]
                   for role in ("reference", "faulty")}
        return fragment(request, "faults", r=r, text=FAULT_TEXT[fault], emitted=emitted, prompt=prompt)

    return await teaching_run(request, playground, FAULT_MAX_TOKENS, run)
