"""The shoot-out: one prompt, every method a target supports, run one after another on the engine.

Each run is a whole session (engine/experiments/traces.py's `trace`); plain decoding runs first and sets t(1), the mean
one-token forward of that run, which every method's c and t(γ+1)/t(1) divide by. Per method:
- mean acceptance length L (tokens per target call) and acceptance per draft position;
- c: drafting time per draft token / t(1); v: the method's mean verification forward (2 to γ+1 rows) / t(1);
- predicted speed-up L / (k c + v) with k the draft tokens per round (γ, fewer where a confidence threshold
  stopped the drafter), and the measured one: plain engine time per token / the method's;
- whether it wrote exactly the plain text; Spec-Bench's published figure beside it; for draft heads, the
  same acceptance projected on an H100 with the Cost model's roofline (engine/experiments/theory.py).
"""
from __future__ import annotations

import math

from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.settings import GenerationSettings
from .theory import ACCELERATORS, projected_costs
from .traces import trace_steps

# Spec-Bench (Xia et al. 2024), Vicuna-7B, greedy, A100: mean accepted tokens per round (prompt lookup = ngram)
SPEC_BENCH = {"eagle": 3.57, "medusa": 2.32, "draft_model": 2.29, "ngram": 1.74}
LABELS = {"none": "plain decoding", "ngram": "n-gram lookup", "draft_model": "draft model", "medusa": "Medusa",
          "eagle": "EAGLE"}


def methods_for(engine: InferenceEngine, target) -> list[str]:
    heads = engine.registry.heads_for(target)
    return (["ngram"] + (["draft_model"] if engine.registry.draft_for(target) is not None else [])
            + [m for m in ("medusa", "eagle") if m in heads])


def mean_forward_ms(summary_times: dict, n: int, upto: int | None = None) -> float | None:
    """The mean ms of the forwards over n rows (n to `upto` rows)."""
    v = [ms for rows in range(n, (upto or n) + 1) for ms in summary_times.get(rows) or []]
    return sum(v) / len(v) if v else None


def h100_speedup(engine: InferenceEngine, target, method: str, acceptance_length: float, drafts_per_round: float,
                 context: int) -> float | None:
    """A draft head's measured acceptance length L and draft forwards per round k on an H100's roofline
    (parameters in bf16, KV of one layer for EAGLE): L / (k c + t(rows)/t(1)), rows = k + 1 rounded up. Medusa's
    heads draft in one pass (k = 1 for its c): its c is every head's bytes, read once."""
    head = engine.registry.heads_for(target).get(method)
    if head is None:
        return None
    cfg = target.cfg
    kv_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    p = projected_costs(ACCELERATORS["H100-SXM"], math.ceil(drafts_per_round), target.model.num_parameters,
                        head.num_parameters + len(head.subset) * cfg.hidden_size,
                        kv_layer * cfg.num_hidden_layers, kv_layer if method == "eagle" else 0, context)
    passes = 1 if method == "medusa" else drafts_per_round
    return acceptance_length / (passes * p["c"] + p["verify_ratio"])


def shootout(engine: InferenceEngine, prompt: str, settings: dict) -> dict:
    return run_to_end(shootout_steps(engine, prompt, settings))


def shootout_steps(engine: InferenceEngine, prompt: str, settings: dict) -> Job[dict]:
    s = GenerationSettings.parse({k: v for k, v in settings.items() if k != "fault"}).model_dump()
    target = engine.registry.get(s["model"])
    gamma = s["num_speculative_tokens"]
    runs = {"none": (yield from trace_steps(engine, prompt, {**s, "method": "none"}, with_times=True))}
    for m in methods_for(engine, target):
        runs[m] = yield from trace_steps(engine, prompt, {**s, "method": m}, with_times=True)
    plain = runs["none"]
    t1 = mean_forward_ms(plain["forward_ms"], 1)
    rows = []
    for m, r in runs.items():
        sm = r["summary"] or {}
        row = {"method": m, "label": LABELS[m], "error": r["error"], "spec_bench": SPEC_BENCH.get(m),
               "identical": r["emitted_ids"] == plain["emitted_ids"],
               "measured": (plain["elapsed_ms"] / plain["num_output_tokens"]) / (r["elapsed_ms"] / r["num_output_tokens"])
               if r["num_output_tokens"] and plain["num_output_tokens"] and r["elapsed_ms"] else None}
        drafts = sm.get("num_drafts") or 0
        if m != "none" and drafts and t1:
            k = sm["num_draft_tokens"] / drafts                 # below γ where a confidence threshold stopped it
            L = sm["mean_acceptance_length"]
            c = sm["draft_time_s"] * 1e3 / sm["num_draft_tokens"] / t1           # per draft token
            verify = mean_forward_ms(r["forward_ms"], 2, gamma + 1)            # fewer rows near the end, or stopped
            v = verify / t1 if verify else None
            rejected = drafts - sum(1 for t in sm["tokens"] if t["status"] == "bonus")
            acc = sm["num_accepted_tokens"]
            alpha = acc / (acc + rejected) if acc + rejected else 0.0
            row.update(mean_acceptance_length=L, per_position=[a / drafts for a in sm["accepted_per_position"]],
                       c=c, verify_ratio=v, alpha=alpha, predicted=L / (k * c + v) if v else None,
                       h100=h100_speedup(engine, target, m, L, k, len(r["emitted_ids"]) + 64))
        rows.append(row)
    return {"settings": s, "model": target.name, "gamma": gamma, "t1_ms": t1, "rows": rows,
            "text": plain["summary"]["text"] if plain["summary"] else ""}
