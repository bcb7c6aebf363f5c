"""Experiments the teaching views show: a faulty run beside a correct one (and the runs of a race).

Each experiment runs whole sessions with `GenerationSession.events()`, one after the other, so that neither
slows the other down: every figure is the session's own engine time (see engine/serving/session.py). Each is a job
(engine/serving/jobs.py) that yields after every round; the plain function runs it to its end.

    trace(engine, prompt, settings)                   -> what one run emitted, with engine-time stamps
    fault_comparison(engine, prompt, settings, fault) -> a correct reference and the faulty run, and the
                                                         first emitted token where they part
    trace_steps, fault_comparison_steps               -> the same as jobs

A race of any two settings is engine/experiments/race.py.
"""
from __future__ import annotations

from ..kv.memory import paging_waste
from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.session import GenerationSession
from ..serving.settings import FAULTS, GenerationSettings, SettingsError

# What each fault needs to show its symptom (the first seed's "common mistakes"):
# - no_causal_mask, no_truncate: greedy, so that the correct run equals plain greedy decoding token for
#   token and any difference is the fault's;
# - unnormalized_residual: sampling (greedy never draws from the residual), so the first rejection raises.
FAULT_TEMPERATURE = {"no_causal_mask": 0.0, "no_truncate": 0.0, "unnormalized_residual": 1.0}


def trace(engine: InferenceEngine, prompt: str, settings: dict, with_times: bool = False) -> dict:
    return run_to_end(trace_steps(engine, prompt, settings, with_times))


def trace_steps(engine: InferenceEngine, prompt: str, settings: dict, with_times: bool = False) -> Job[dict]:
    """Run one session to its end. Every token event (rejected drafts included) gets `t_ms`: the session's
    engine time when its round ended, which is when it was delivered. with_times: also every target forward's
    ms by its number of new tokens (`forward_ms`)."""
    session = GenerationSession(engine, prompt, settings)
    tokens, pending, summary, error, rounds, elapsed_ms = [], [], None, None, 0, 0.0
    for e in session.events():
        if e.type == "token":
            pending.append({"id": e.id, "text": e.text, "status": e.status, "round": e.round,
                            "position": e.position})
        elif e.type == "metrics":
            elapsed_ms = e.values["elapsed_s"] * 1e3
            for t in pending:
                t["t_ms"] = elapsed_ms
            tokens += pending
            pending = []
            yield                    # a round is done (its time is the session's own engine time)
        elif e.type == "round":
            rounds = e.round
        elif e.type == "done":
            summary = e.summary
        elif e.type == "error":
            error = e.message        # the failing round's events were never delivered (pending stays out)
    emitted = [t for t in tokens if t["status"] != "rejected"]
    out = {"settings": session.settings.model_dump(), "tokens": tokens, "emitted_ids": [t["id"] for t in emitted],
           "num_output_tokens": len(emitted), "rounds": rounds, "elapsed_ms": elapsed_ms,
           "summary": summary, "error": error}
    if with_times:
        out["forward_ms"] = {n: list(v) for n, v in session.stats.target_ms_by_tokens.items()}
    return out


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """Index of the first emitted token where two runs differ (or where the shorter one ends); None if equal."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def fault_settings(engine: InferenceEngine, settings: dict, fault: str) -> dict:
    """The settings both runs of a fault comparison use: the given ones, made to show the fault."""
    if fault not in FAULTS or fault == "none":
        raise SettingsError("fault", f"one of {', '.join(f for f in FAULTS if f != 'none')}, got {fault!r}")
    base = GenerationSettings.parse({k: v for k, v in settings.items() if k != "fault"})
    out = base.model_dump()
    out["temperature"] = FAULT_TEMPERATURE[fault]
    if base.method == "none":      # the faults live in verification: something must be proposed
        target = engine.registry.get(base.model)
        out["method"] = "draft_model" if engine.registry.draft_for(target) is not None else "ngram"
    return out


def fault_comparison(engine: InferenceEngine, prompt: str, settings: dict, fault: str) -> dict:
    return run_to_end(fault_comparison_steps(engine, prompt, settings, fault))


def fault_comparison_steps(engine: InferenceEngine, prompt: str, settings: dict, fault: str) -> Job[dict]:
    """A correct reference run and the same run with `fault`, and where their emitted tokens first differ.

    For the unnormalised residual the faulty run stops with numpy's error at its first rejection; the point
    of divergence is then the token that round would have delivered."""
    s = fault_settings(engine, settings, fault)
    reference = yield from trace_steps(engine, prompt, {**s, "fault": "none"})
    faulty = yield from trace_steps(engine, prompt, {**s, "fault": fault})
    return {"fault": fault, "settings": s, "reference": reference, "faulty": faulty,
            "divergence": first_divergence(reference["emitted_ids"], faulty["emitted_ids"])}


def paging_figures(lengths: list[int], blocks: int, block_size: int, context: int) -> dict:
    """Sequences of `lengths` tokens held in `blocks` blocks: the share of those blocks' slots unused (paged),
    and the share unused had each sequence been given `context` slots up front (preallocated). `context` is
    the model's: a sequence here may grow to it (SEQUENCE_TOKENS_BUDGET only sizes the shared pools)."""
    tokens, slots = sum(lengths), blocks * block_size
    return {"sequences": len(lengths), "tokens": tokens, "blocks": blocks, "block_size": block_size,
            "slots": slots, "context": context, "paged": 1 - tokens / slots if slots else None,
            "prealloc": paging_waste(lengths, None, context) if lengths and context else None}


def live_pools(engine: InferenceEngine) -> list[dict]:
    """Every KV pool of the engine now: the sequences it holds, their tokens, and the waste of their blocks
    beside what preallocating each sequence's whole context would have wasted. (On the server: an engine
    thread call, between two steps.)"""
    out = []
    for mgr in list(engine.managers.values()):
        held = [s for s in mgr.sequences.values() if s.num_tokens]
        figures = paging_figures([s.num_tokens for s in held], sum(len(s.blocks) for s in held), mgr.block_size,
                                 mgr.cfg.max_position_embeddings)
        out.append({"name": mgr.pool.name, "kv_cache_dtype": mgr.dtype.name, **figures})
    return out
