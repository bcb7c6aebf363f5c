"""The Theory view's figures, all computed in engine/ (static/theory.js only draws them):

- `GET /teach/curve.json`: this machine's measured verify-cost curve t(n) of a model and its draft's step
  (engine/experiments/measure.py), measured once per model as an engine job (app/curves.py); the Cost view
  uses it too;
- `GET /teach/theory.json?recording=KEY&rounds=N`: a run's first N rounds against the formulas
  (engine/experiments/theory.py's `run_series`), with that curve's t(1) and t(n)/t(1) once it is measured (the
  view asks again until then: it never waits for one, nor makes a run wait); a curve that is not physical is
  not used. A suffix decoding run's rounds also give its draft length against its match length (`suffix`); for
  a run that drafts token trees, beside them the tree's tokens per target forward and a chain's E at the α and
  depth measured in its rounds (`tree_against_chain`)."""
from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import model_of
from app.views.recording import RECORDINGS
from engine.experiments.theory import (RoundPoint, SuffixRound, curve_ratios, run_series, suffix_series,
                                       tree_against_chain)

router = APIRouter()
MAX_ROUNDS = 4096            # the charts show at most the last this many rounds


async def verify_cost(playground, model_name: str | None) -> dict:
    """The curve of a model, waiting for its measurement (KeyError: no such model)."""
    return await playground.curves.get(playground, playground.engine.registry.get(model_name))


@router.get("/curve.json")
async def curve_json(playground: PlaygroundDep, model: str | None = None, recording: str | None = None):
    if playground.engine is None:
        return JSONResponse({"error": playground.load_error or "no models loaded"}, status_code=503)
    try:
        return JSONResponse(await verify_cost(playground, model_of(recording, model)))
    except KeyError as e:
        return JSONResponse({"error": str(e.args[0])}, status_code=404)


def recorded_rounds(rec, rounds: int | None) -> tuple[list[RoundPoint], str, list[SuffixRound]]:
    """The first `rounds` rounds of a recording (all: None), the drafter of the last of them, and the rounds whose
    draft came with a suffix match (its length in the draft event's origin). A token tree's round also gives its
    depth and, per position, whether the first child tried there was accepted."""
    points, method, suffix, match_len = [], rec.settings.get("method") or "none", [], None
    depth, first_tries = 0, {}
    for e in list(rec.events):
        if rounds is not None and len(points) >= rounds:
            break
        if e.type == "draft":
            method, match_len = e.method, (e.origin or {}).get("match_len")
            depth, first_tries = e.tree["depth"] if e.tree else 0, {}
        elif e.type == "token" and e.siblings:
            first_tries[e.position] = bool(e.siblings[0]["accepted"])
        elif e.type == "round":
            points.append(RoundPoint(e.target_ms, e.draft_ms, e.num_emitted, e.num_draft_tokens, e.num_accepted,
                                     depth, tuple(first_tries.values())))
            if match_len is not None:
                suffix.append(SuffixRound(match_len, e.num_draft_tokens, e.num_accepted))
            match_len, depth, first_tries = None, 0, {}
    return points[-MAX_ROUNDS:], method, suffix[-MAX_ROUNDS:]


@router.get("/theory.json")
async def theory_json(playground: PlaygroundDep, recording: str = "", rounds: int | None = None):
    rec = RECORDINGS.get(recording)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    points, method, suffix = recorded_rounds(rec, rounds)
    curve = None
    if playground.engine is not None:
        try:
            curve = playground.curves.peek(playground, playground.engine.registry.get(model_of(recording, None)))
        except KeyError:                  # a model no longer served: figures without its curve
            curve = None
    usable = curve if curve is not None and curve["physical"] else None
    t1, ratios = curve_ratios(usable)
    series, s = run_series(points, t1, ratios, method), rec.settings
    by_match = suffix and suffix_series(suffix, s["num_speculative_tokens"], s["suffix_decoding_max_spec_factor"],
                                        s["suffix_decoding_max_tree_depth"])
    return JSONResponse({**series, "tree": tree_against_chain(points), "suffix": by_match or None,
                         "model": curve["model"] if curve else None, "measured_curve": curve is not None,
                         "curve_note": curve_note(curve)})


def curve_note(curve: dict | None) -> dict | None:
    """What the view says beside a curve: its age, the load it was measured under, whether it is physical."""
    if curve is None:
        return None
    return {"age_s": max(0.0, time.time() - curve["taken_at"]), "load_average": curve["load_average"],
            "cores": curve["cores"], "physical": curve["physical"], "violations": curve["violations"],
            "noise": curve["noise"], "repeats": curve["repeats"]}
