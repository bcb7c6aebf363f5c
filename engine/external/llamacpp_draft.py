"""llama.cpp's acceptance with SmolLM2's shipped draft model, read from its server's answers.

    figures = draft_model_acceptance(prompts, max_tokens=96)     # greedy, γ = DRAFT_GAMMA; {"skipped": why} if it cannot

llama.cpp's server reports, in the `timings` of a request's last chunk, `draft_n` (the draft tokens it proposed for
that request) and `draft_n_accepted` (those the target kept). It gives no steps and no per-position counts, so the
figure that compares with ours is the rate, accepted over proposed, pooled over the prompts; with p_min 0 (no early
stop, engine/external/llamacpp_process.py) every step proposes γ tokens unless the request's end is nearer.
"""
from __future__ import annotations

from pathlib import Path

from .llamacpp_server import DRAFT_GAMMA, EmbeddedLlamaCpp, draft_gguf, gguf_path, unavailable_reason
from .openai_stream import ExternalEngine, run_coroutine, stream_chat


def draft_counts(timings: dict | None) -> tuple[int, int] | None:
    """(draft_n, draft_n_accepted) of one answer's `timings`; None when it has no draft counts."""
    n, accepted = (timings or {}).get("draft_n"), (timings or {}).get("draft_n_accepted")
    if not isinstance(n, int) or not isinstance(accepted, int) or not 0 <= accepted <= n:
        return None
    return n, accepted


def pooled_rate(counts: list[tuple[int, int]]) -> dict:
    """Proposed and accepted draft tokens summed over answers, and their ratio (None without a proposal)."""
    n, accepted = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return {"draft_n": n, "draft_n_accepted": accepted, "acceptance_rate": accepted / n if n else None}


async def greedy_answer(engine: ExternalEngine, prompt: str, max_tokens: int) -> dict:
    """One chat answer at temperature 0: its summary (`engine_timings` holds llama.cpp's `timings`)."""
    events = [e async for e in stream_chat(engine, prompt, {"max_tokens": max_tokens, "temperature": 0.0})]
    if events[-1].type != "done":
        raise RuntimeError(f"{engine.name}: {events[-1].message}")
    return events[-1].summary


def draft_model_acceptance(prompts: list[str], max_tokens: int, threads: int = 1, cache: Path | None = None) -> dict:
    """llama.cpp on SmolLM2's GGUF with the shipped draft's GGUF, greedy, γ = DRAFT_GAMMA: its pooled acceptance
    rate over `prompts` and the counts per prompt; {"skipped": reason} when it cannot run here."""
    draft = draft_gguf(cache)
    reason = unavailable_reason(gguf_path(cache)) or (None if draft.is_file() else
                                                      f"{draft}: no draft GGUF (decoding-playground fetch-model)")
    if reason:
        return {"skipped": reason}
    server = EmbeddedLlamaCpp.start(gguf_path(cache), threads=threads, parallel=1, draft=draft, cache=cache)
    try:
        counts = [draft_counts(run_coroutine(greedy_answer(server.engine, p, max_tokens)).get("engine_timings"))
                  for p in prompts]
    except RuntimeError as e:                      # a request that failed: the row says why
        return {"skipped": str(e)}
    finally:
        server.close()
    if None in counts:
        return {"skipped": "llama.cpp's timings held no draft counts (draft_n, draft_n_accepted)"}
    return {"gamma": DRAFT_GAMMA, **pooled_rate(counts), "per_prompt": counts}
