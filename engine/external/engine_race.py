"""A race of engines: our numpy engine against an external one (llama.cpp, vLLM, ...) on the same prompt.

A decode step at batch 1 reads every weight once, so two engines on the same model should differ in speed
about as much as in the bytes their weights take: float32 in ours, Q4_1 (about 5x fewer) in llama.cpp's
GGUF. The race puts that prediction beside the measured ratio:

    ours = trace(engine, prompt, settings)                  # engine/experiments/traces.py, on the engine thread
    theirs = await external_trace(external, prompt, settings)
    r = engine_race(ours, our_bytes, theirs, their_bytes)   # lanes, the prediction, the measured ratio

Each side runs alone, one after the other, on its own clock: ours is the session's engine time, theirs the
arrival of its chunks here (the server's own per-token time beside it where it reports one). Speed is the
decode phase's ms per token (after the first token), which is what the bytes predict; prefill is not.
"""
from __future__ import annotations

import time

from ..serving.settings import SettingsError
from .openai_stream import ExternalEngine, stream_chat

OURS = "numpy"          # the form value of our engine's side
SETTING = "engine"      # the race's setting name (beside engine/experiments/race.py's RACE_SETTINGS)
LABEL = "engine: numpy / a real server"


def engine_choices(external_names) -> list[tuple[str, str]]:
    """The race's values: our engine, then each configured engine (form value, label)."""
    return [(OURS, "our numpy engine (float32, plain decoding)")] + [(n, n) for n in external_names]


def engine_pair(values, external_names, model: str | None = None) -> tuple[str, str]:
    """Side a is our engine, side b a configured engine (the first one when `values` is None); our side runs on
    `model` (the page's), which must be one of ours."""
    names = list(external_names)
    a, b = values if values is not None else (OURS, names[0] if names else None)
    if a != OURS or b not in names:
        raise SettingsError("race", f"side A our numpy engine ({OURS}), side B one of the configured engines: "
                                    f"{', '.join(names) or 'none is configured (serve --openai-url, llama.cpp)'}")
    if model in names:
        raise SettingsError("model", "a race of engines runs our side on one of our models: pick SmolLM2 "
                                     "(the weights llama.cpp serves) in the model selector")
    return a, b


def race_settings(settings: dict, has_chat_template: bool) -> tuple[dict, dict]:
    """Our side's settings (plain decoding, with the chat template where the model has one, as a server
    answers a chat request) and the settings sent to the server (the sampling ones; the rest are its own)."""
    ours = {**settings, "method": "none", "chat": has_chat_template}
    return ours, {k: settings[k] for k in ("max_tokens", "temperature", "top_p", "seed") if k in settings}


async def external_trace(engine: ExternalEngine, prompt: str, settings: dict) -> dict:
    """`teaching.trace` for an external engine: every token stamped `t_ms`, its arrival since the request."""
    t0 = time.perf_counter()
    tokens, summary, error, rounds = [], None, None, 0
    async for e in stream_chat(engine, prompt, settings):
        if e.type == "token":
            tokens.append({"id": e.id, "text": e.text, "status": e.status, "round": e.round,
                           "position": e.position, "t_ms": (time.perf_counter() - t0) * 1e3})
        elif e.type == "round":
            rounds = e.round
        elif e.type == "done":
            summary = e.summary
        elif e.type == "error":
            error = e.message
    return {"settings": {**settings, "model": engine.name}, "tokens": tokens, "emitted_ids": [],
            "num_output_tokens": len(tokens), "rounds": rounds,
            "elapsed_ms": tokens[-1]["t_ms"] if tokens else 0.0, "summary": summary, "error": error}


def decode_ms_per_token(run: dict) -> float | None:
    """The decode phase's ms per token: (last token - first token) / (tokens - 1), on the run's clock."""
    tokens = run["tokens"]
    emitted = [t for t in tokens if t["status"] != "rejected"]
    if len(emitted) < 2 or emitted[-1]["t_ms"] <= emitted[0]["t_ms"]:
        return None
    return (emitted[-1]["t_ms"] - emitted[0]["t_ms"]) / (len(emitted) - 1)


def lane(role: str, label: str, run: dict, weight_bytes: int | None) -> dict:
    ms = decode_ms_per_token(run)
    return {"role": role, "value": label, "label": label, "run": run,
            "figures": {"ms_per_token": ms, "weight_bytes_per_token": weight_bytes,
                        "gb_per_s": weight_bytes / ms / 1e6 if weight_bytes and ms else None,
                        "kv_bytes_per_token": None, "acceptance_rate": None, "mean_acceptance_length": None}}


def megabytes(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


def engine_verdict(a: dict, b: dict) -> dict:
    """Side b against side a: the ratio the weight bytes predict, and the ratio of decode ms per token."""
    fa, fb = a["figures"], b["figures"]
    bytes_a, bytes_b = fa["weight_bytes_per_token"], fb["weight_bytes_per_token"]
    predicted = bytes_a / bytes_b if bytes_a and bytes_b else None
    measured = fa["ms_per_token"] / fb["ms_per_token"] if fa["ms_per_token"] and fb["ms_per_token"] else None
    if predicted is None:
        said = f"{b['label']} does not publish its weight bytes: no prediction"
    else:
        said = (f"{b['label']} reads {megabytes(bytes_b)} of weights per token against {megabytes(bytes_a)}: "
                f"the bytes predict {predicted:.1f}× {'faster' if predicted >= 1 else 'slower'}")
    if measured is None:
        said += "; no decode speed measured (fewer than two tokens, or an error)"
    else:
        said += f"; measured {measured:.1f}× {'faster' if measured >= 1 else 'slower'} per token (decode)"
        if predicted:
            said += f", {measured / predicted:.0%} of the prediction"
    return {"text": said + ".", "speedup": measured, "predicted": predicted, "kv_ratio": None}


def their_weight_bytes(engine, our_name: str, our_bytes: int) -> int | None:
    """The weight bytes a configured server reads a token: what it publishes about its file (llama.cpp's size),
    else ours where it serves our very checkpoint at our dtype (the vLLM servers `serve --vllm` starts: float32
    on the fetched SmolLM2); None where neither says."""
    d = engine.description
    published = (d.get("published") or {}).get("size")
    if published:
        return published
    return our_bytes if engine.model == our_name and d.get("dtype") == "float32" else None


def engine_race(ours: dict, our_label: str, our_bytes: int, theirs: dict, their_label: str,
                their_bytes: int | None) -> dict:
    """The race's result, in the shape of engine/experiments/race.py's (its template draws both)."""
    lanes = [lane("a", our_label, ours, our_bytes), lane("b", their_label, theirs, their_bytes)]
    text_a = (ours["summary"] or {}).get("text")
    return {"setting": "engine", "settings": ours["settings"], "lanes": lanes,
            "verdict": engine_verdict(*lanes),
            "same_text": text_a is not None and text_a == (theirs["summary"] or {}).get("text"),
            "finish_ms": max(ours["elapsed_ms"], theirs["elapsed_ms"])}
