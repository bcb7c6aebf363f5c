"""Measurements the teaching views and the benchmarks share, each as a job (engine/serving/jobs.py).

    verify_curve_steps(lm)                 -> {n: ms} of one target forward over n new tokens
    verify_cost_steps(registry, lm)        -> that curve at every γ + 1, the draft's step, their ratio c, and
                                              whether the curve is physical, its noise, age and the load
    roofline_steps(lm)                     -> per thread count: the weights' read bandwidth, the step it predicts,
                                              the step measured

Each job yields between timed pieces, never inside one, and times them on the engine clock (engine/kv/runner.py's
`clock_for`: the engine thread's CPU time, unless helper threads share the work): what the engine thread runs
between two steps does not count, nor waiting.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from ..kv.cache import KVCacheManager
from ..kv.runner import clock_for
from ..model.layout import WeightStream, weight_bytes
from ..model.llama import forward
from ..model.thread_choice import available_cores, candidate_threads
from ..model.threads import read_chunked, threads, using_threads
from ..serving.jobs import Job, run_to_end
from ..serving.registry import ModelRegistry

CURVE_NS = tuple(range(1, 18))          # verify sizes: gamma + 1 for gamma up to 16
LARGE_MODEL_PARAMS = 20e6               # beyond this a curve is measured at fewer sizes
LARGE_NS = (1, 2, 3, 5, 9, 17)
CURVE_CONTEXT = 100
# Forwards per size: a size's figure is their median. Enough that t(n) >= t(1) holds within the noise on a
# shared machine (a large model's curve at 2 repeats had t(2)/t(1) = 0.92), few enough that SmolLM2's
# curve takes ~10 s of engine time.
CURVE_REPEATS = 21
LARGE_CURVE_REPEATS = 11
CURVE_ATTEMPTS = 2                      # a curve that is not physical is measured again, then flagged
MIN_NOISE = 0.02                        # the least relative noise a curve states


def verify_curve_samples(lm, context: int = CURVE_CONTEXT, ns=(1, 2, 3, 4, 5, 7, 9),
                         repeats: int = 21) -> Job[dict[int, list[float]]]:
    """ms of one target forward over n new tokens at a context of `context` tokens, `repeats` times per size; the
    sizes interleaved (1, 2, 3, ..., then again), so that a change of the machine's load hits them alike. A step
    is one forward (a large model's is tens of ms)."""
    cfg = lm.cfg
    tokens = np.random.default_rng(0).integers(2, cfg.vocab_size, context + max(ns))
    mgr = KVCacheManager(cfg, num_blocks=(context + max(ns)) // 16 + 2, block_size=16)
    seq = mgr.new_sequence()
    forward(lm.model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))
    times = {n: [] for n in ns}
    for _ in range(repeats):
        for n in ns:
            new = tokens[context:context + n]
            yield
            clock = clock_for(lm.model)
            t = clock()
            forward(lm.model, new, context, mgr.append_slots(seq, new))
            mgr.truncate(seq, context)
            times[n].append((clock() - t) * 1e3)
    return times


def verify_curve_steps(lm, context: int = CURVE_CONTEXT, ns=(1, 2, 3, 4, 5, 7, 9), repeats: int = 21,
                       summary=statistics.median) -> Job[dict[int, float]]:
    """The median ms (or another `summary` of the repeats) of one target forward over n new tokens."""
    times = yield from verify_curve_samples(lm, context, ns, repeats)
    return {n: summary(v) for n, v in times.items()}


def verify_curve(lm, context: int = CURVE_CONTEXT, ns=(1, 2, 3, 4, 5, 7, 9), repeats: int = 21,
                 summary=statistics.median) -> dict[int, float]:
    return run_to_end(verify_curve_steps(lm, context, ns, repeats, summary))


def curve_at(curve: dict[int, float], n: float) -> float:
    """t(n) from the measured curve, linearly interpolated between measured sizes."""
    if n in curve:
        return curve[n]
    xs = sorted(curve)
    return float(np.interp(n, xs, [curve[x] for x in xs]))


def relative_noise(samples: list[float]) -> float:
    """Half the interquartile range of the samples over their median."""
    q1, median, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (samples[0],) * 3
    return (q3 - q1) / 2 / median if median else 0.0


def physical_check(curve: dict[int, float], noise: float) -> list[int]:
    """The sizes n > 1 whose t(n) is below t(1) by more than the noise: one forward over more tokens cannot be
    cheaper than over one. [] for a physical curve."""
    return [n for n, ms in sorted(curve.items()) if n > 1 and ms < curve[1] * (1 - noise)]


def verify_cost_steps(registry: ModelRegistry, lm) -> Job[dict]:
    """t(n) of one target forward over n new tokens (ms, 100-token context) for n = 1 ... 17, and one step of
    its draft model: the median of the repeats. A large model is measured at fewer sizes, interpolated between
    them. A curve with t(n) < t(1) beyond its noise is measured again, then returned with `physical` False and
    the sizes that break it (`violations`). `taken_at` (Unix time), the load average and the cores say how
    old it is and how busy the machine was."""
    started, load = time.perf_counter(), os.getloadavg()
    large = lm.model.num_parameters > LARGE_MODEL_PARAMS
    ns = LARGE_NS if large else CURVE_NS
    repeats = LARGE_CURVE_REPEATS if large else CURVE_REPEATS
    for attempt in range(1, CURVE_ATTEMPTS + 1):
        samples = yield from verify_curve_samples(lm, ns=ns, repeats=repeats)
        curve = {n: statistics.median(v) for n, v in samples.items()}
        noise = max(MIN_NOISE, relative_noise(samples[1]))
        violations = physical_check(curve, noise)
        if not violations:
            break
    draft = registry.draft_for(lm)
    draft_ms = None
    if draft is not None:
        draft_ms = (yield from verify_curve_steps(draft, ns=(1,), repeats=repeats))[1]
    # a model whose weights do not fit in the caches: one pass over its weight bytes, the floor of t(1)
    streamed = hasattr(lm.model, "weights_stream_ms")
    roofline = (yield from roofline_steps(lm, repeats=3 if large else 5)) if streamed else None
    return {"model": lm.name, "draft": draft.name if draft else None, "context": CURVE_CONTEXT,
            "threads": threads() if streamed else 1, "roofline": roofline,
            "target_ms": {n: curve_at(curve, n) for n in CURVE_NS}, "measured_at": list(ns),
            "repeats": repeats, "attempts": attempt, "noise": noise, "physical": not violations,
            "violations": violations, "draft_ms": draft_ms, "c": draft_ms / curve[1] if draft_ms else None,
            "floor_ms": (next(r["predicted_ms"] for r in roofline if r["threads"] == threads())
                         if streamed else None),
            "weight_bytes": weight_bytes(lm.model) if streamed else None,
            "taken_at": time.time(), "load_average": [round(x, 2) for x in load],
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
            "seconds": time.perf_counter() - started}


def roofline_steps(lm, context: int = CURVE_CONTEXT, repeats: int = 5) -> Job[list[dict]]:
    """Per thread count, 1 up to the more of the process's count and what a default may use here: the fastest
    pass over the model's weight bytes on that many threads (engine/model/threads.py), its bandwidth and the
    step time it predicts (the bytes at that bandwidth: the roofline), and the fastest decode step at `context`
    tokens on as many threads beside it. The counts take turns; each timed piece runs at its count, and the
    process's count is back in force at every yield (where the engine thread runs other sessions' steps)."""
    model, cfg = lm.model, lm.cfg
    counts = range(1, max(threads(), candidate_threads(available_cores())) + 1)
    tokens = np.random.default_rng(0).integers(2, cfg.vocab_size, context + 1)
    mgr = KVCacheManager(cfg, num_blocks=(context + 1) // 16 + 2, block_size=16)
    seq = mgr.new_sequence()
    forward(model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))
    stream = WeightStream(model)
    read, step = {n: [] for n in counts}, {n: [] for n in counts}
    for _ in range(repeats):
        for n in counts:
            yield
            with using_threads(n) as pool:
                t = time.perf_counter()
                read_chunked(stream.flat, pool)
                read[n].append((time.perf_counter() - t) * 1e3)
            yield
            with using_threads(n):
                t = time.perf_counter()
                forward(model, tokens[context:], context, mgr.append_slots(seq, tokens[context:]))
                step[n].append((time.perf_counter() - t) * 1e3)
                mgr.truncate(seq, context)
    mgr.free(seq)
    rows = []
    for n in counts:
        read_ms, step_ms = min(read[n]), min(step[n])
        rows.append({"threads": n, "read_gb_per_s": stream.nbytes / read_ms / 1e6, "predicted_ms": read_ms,
                     "step_ms": step_ms, "step_over_predicted": step_ms / read_ms,
                     "speedup": min(step[1]) / step_ms})
    return rows

