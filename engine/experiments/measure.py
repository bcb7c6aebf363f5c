"""Measurements the teaching views and the benchmarks share, each as a job (engine/serving/jobs.py).

    verify_curve_steps(lm)                 -> {n: ms} of one target forward over n new tokens
    verify_cost_steps(registry, lm)        -> that curve at every γ + 1, the draft's step and their ratio c
    roofline_steps(lm)                     -> per thread count: the weights' read bandwidth, the step it predicts,
                                              the step measured
    distribution_steps(engine, prompt, …)  -> the first seed's distribution check (TVD against p)

Each job yields between timed pieces, never inside one: on the server the engine thread runs other
sessions' steps there (which only ever adds time to what follows, so the curves keep the fastest repeat).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..kv.cache import KVCacheManager
from ..model.layout import WeightStream, weight_bytes
from ..model.llama import forward, forward_no_cache
from ..model.thread_choice import available_cores, candidate_threads
from ..model.threads import read_chunked, threads, using_threads
from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine, ModelRegistry
from ..serving.settings import SettingsError
from ..spec_decode.sampling import probs_from_logits, sample
from ..spec_decode.verify import verify

CURVE_NS = tuple(range(1, 18))          # verify sizes: gamma + 1 for gamma up to 16
LARGE_MODEL_PARAMS = 20e6               # beyond this a curve is measured at fewer sizes
CURVE_CONTEXT = 100
DISTRIBUTION_SLICE = 500                # samples a step of the distribution check


def verify_curve_steps(lm, context: int = CURVE_CONTEXT, ns=(1, 2, 3, 4, 5, 7, 9), repeats: int = 21,
                       summary=statistics.median) -> Job[dict[int, float]]:
    """Median ms (or another `summary` of the repeats, e.g. `min` on a busy machine: interference only ever
    adds time) of one target forward over n new tokens at a context of `context` tokens."""
    cfg = lm.cfg
    tokens = np.random.default_rng(0).integers(2, cfg.vocab_size, context + max(ns))
    mgr = KVCacheManager(cfg, num_blocks=(context + max(ns)) // 16 + 2, block_size=16)
    seq = mgr.new_sequence()
    forward(lm.model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))
    times = {n: [] for n in ns}
    for _ in range(repeats):
        for n in ns:
            new = tokens[context:context + n]
            seconds = 0.0
            for _ in range(5):           # a step each: a large model's forward alone is tens of ms
                yield
                t = time.perf_counter()
                forward(lm.model, new, context, mgr.append_slots(seq, new))
                mgr.truncate(seq, context)
                seconds += time.perf_counter() - t
            times[n].append(seconds / 5 * 1e3)
    return {n: summary(v) for n, v in times.items()}


def verify_curve(lm, context: int = CURVE_CONTEXT, ns=(1, 2, 3, 4, 5, 7, 9), repeats: int = 21,
                 summary=statistics.median) -> dict[int, float]:
    return run_to_end(verify_curve_steps(lm, context, ns, repeats, summary))


def curve_at(curve: dict[int, float], n: int) -> float:
    """t(n) from the measured curve, linearly interpolated between measured sizes."""
    if n in curve:
        return curve[n]
    xs = sorted(curve)
    return float(np.interp(n, xs, [curve[x] for x in xs]))


def verify_cost_steps(registry: ModelRegistry, lm) -> Job[dict]:
    """t(n) of one target forward over n new tokens (ms, 100-token context) for n = 1 ... 17, and one step of
    its draft model: the fastest of the repeats (on a shared machine interference only adds time). A large
    model is measured at fewer sizes and repeats, and interpolated between them."""
    t = time.perf_counter()
    large = lm.model.num_parameters > LARGE_MODEL_PARAMS
    ns = (1, 2, 3, 5, 9, 17) if large else CURVE_NS
    repeats = 2 if large else 11
    curve = yield from verify_curve_steps(lm, ns=ns, repeats=repeats, summary=min)
    draft = registry.draft_for(lm)
    draft_ms = None
    if draft is not None:
        draft_ms = (yield from verify_curve_steps(draft, ns=(1,), repeats=repeats, summary=min))[1]
    # a model whose weights do not fit in the caches: one pass over its weight bytes, the floor of t(1)
    streamed = hasattr(lm.model, "weights_stream_ms")
    roofline = (yield from roofline_steps(lm, repeats=3 if large else 5)) if streamed else None
    return {"model": lm.name, "draft": draft.name if draft else None, "context": CURVE_CONTEXT,
            "threads": threads() if streamed else 1, "roofline": roofline,
            "target_ms": {n: curve_at(curve, n) for n in CURVE_NS}, "measured_at": list(ns),
            "draft_ms": draft_ms, "c": draft_ms / curve[1] if draft_ms else None,
            "floor_ms": (next(r["predicted_ms"] for r in roofline if r["threads"] == threads())
                         if streamed else None),
            "weight_bytes": weight_bytes(lm.model) if streamed else None,
            "seconds": time.perf_counter() - t}


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


def tvd(counts, p) -> float:
    """Total variation distance between the empirical distribution of `counts` and p."""
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def distribution_steps(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                       progress=None) -> Job[dict]:
    """The first seed's experiment: one round with gamma = 1 from `prompt`, `samples` times.

    Speculative sampling (draft x ~ q, verified against p by `engine.speculative.verify`), direct sampling
    from p, and draft-only sampling from q, each compared with p by total variation distance. `progress(i, n)`
    is told how far it is after every slice.
    """
    if temperature <= 0:
        raise SettingsError("temperature", "the distribution check needs temperature > 0")
    target = engine.registry.default_target()
    draft = engine.registry.draft_for(target)
    ids = target.tokenizer.encode(prompt)
    p = probs_from_logits(forward_no_cache(target.model, ids)[-1], temperature)
    q = probs_from_logits(forward_no_cache(draft.model, ids)[-1], temperature)
    rng = np.random.default_rng(seed)
    V = len(p)
    spec, accepted = np.zeros(V), 0
    p2 = np.stack([p, p])
    seconds = 0.0
    every = max(1, samples // 20)
    for i in range(samples):
        if i % DISTRIBUTION_SLICE == 0:
            yield
            t = time.perf_counter()
        x = sample(q, rng)
        verdicts, _ = verify([x], q[None], p2, rng)
        first = verdicts[0] if verdicts[0].status == "accepted" else verdicts[1]
        spec[first.token_id] += 1
        accepted += verdicts[0].status == "accepted"
        if progress and ((i + 1) % every == 0 or i + 1 == samples):
            progress(i + 1, samples)
        if (i + 1) % DISTRIBUTION_SLICE == 0 or i + 1 == samples:
            seconds += time.perf_counter() - t
    yield
    t = time.perf_counter()
    direct = np.bincount(rng.choice(V, size=samples, p=p), minlength=V).astype(float)
    draft_only = np.bincount(rng.choice(V, size=samples, p=q), minlength=V).astype(float)
    seconds += time.perf_counter() - t
    top = np.argsort(-p)[:8]
    tok = target.tokenizer
    return {"prompt": prompt, "samples": samples, "temperature": temperature, "seed": seed,
            "target": target.name, "draft": draft.name,
            "acceptance_rate": accepted / samples, "theory_sum_min_p_q": float(np.minimum(p, q).sum()),
            "tvd_speculative": tvd(spec, p), "tvd_direct": tvd(direct, p), "tvd_draft_only": tvd(draft_only, p),
            "seconds": seconds,
            "top_tokens": [{"text": tok.token_text(int(i)), "p": float(p[i]), "q": float(q[i]),
                            "speculative": float(spec[i] / samples), "direct": float(direct[i] / samples),
                            "draft_only": float(draft_only[i] / samples)} for i in top]}


def check_distribution(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                       progress=None) -> dict:
    return run_to_end(distribution_steps(engine, prompt, samples, temperature, seed, progress))
