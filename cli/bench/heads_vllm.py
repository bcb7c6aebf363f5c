"""`bench heads`' vLLM part: vLLM's mean acceptance length with our EAGLE head (exported to its layout,
engine/training/vllm_export.py) beside ours, on the same held-out questions, greedy, γ = 3, in three rows: the head
as our engine drafts with it (a vocabulary subset plus the context's tokens), the same head drafting from the whole
vocabulary as vLLM's shared LM head does, and vLLM's own per-request figures. Greedy acceptance does not depend on
the machine's load.
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from cli.bench.lib import generation, table
from cli.bench.vllm_engines import chat_summary
from engine.external.vllm_rounds import acceptance_figures, own_counts
from engine.external.vllm_server import EAGLE_GAMMA, VARIANTS, VllmServer, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir
from engine.spec_decode.heads import HEADS_DIR, load_heads
from engine.training.vllm_export import export_eagle_for_vllm


def ours(engine, name: str, prompts, max_tokens: int, gamma: int) -> dict:
    steps, per_pos = 0, [0] * gamma
    for prompt in prompts:
        summary = generation(engine, prompt, {"model": name, "chat": True, "temperature": 0, "max_tokens": max_tokens,
                                              "method": "eagle", "num_speculative_tokens": gamma,
                                              "enable_prefix_caching": False})[1]
        steps += summary["num_drafts"]
        per_pos = [a + b for a, b in zip(per_pos, summary["accepted_per_position"] + [0] * gamma)]
    return acceptance_figures(steps, per_pos)


def full_vocabulary_head(registry, lm):
    """The shipped EAGLE head drafting from the whole vocabulary (its subset: every token)."""
    weights = load_file(str(HEADS_DIR / lm.name / "eagle.safetensors"))
    weights["vocab_subset"] = np.arange(lm.cfg.vocab_size, dtype=np.int64)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / lm.name).mkdir()
        save_file(weights, str(Path(folder) / lm.name / "eagle.safetensors"))
        model = lm.model
        return load_heads(lm.name, lm.cfg, model.embed, lm.path, Path(folder), model.layout)["eagle"]


def theirs(prompts, max_tokens: int, name: str) -> dict:
    cache = cache_dir()
    reason = unavailable_reason(default_venv(cache), model_dir(name, cache))
    if reason:
        return {"skipped": reason}
    draft = export_eagle_for_vllm(name, cache / "vllm" / "heads" / name)
    server = VllmServer(VARIANTS["eagle"], default_venv(cache), model_dir(name, cache), cache / "vllm",
                        draft_dir=draft)
    server.start()
    try:
        if not asyncio.run(server.wait_ready()):
            return {"skipped": f"vLLM did not start: {server.error}"}
        steps, per_pos = 0, [0] * EAGLE_GAMMA
        for prompt in prompts:
            counts = own_counts(chat_summary(server.engine, prompt, max_tokens)["engine_metrics"], EAGLE_GAMMA)
            if counts is None:
                return {"skipped": "vLLM sent no per-request figures (--per-request-spec-decode-metrics detailed)"}
            steps += counts[0]
            per_pos = [p + a for p, a in zip(per_pos, counts[1])]
        return acceptance_figures(steps, per_pos)
    except RuntimeError as e:                      # a request that failed: the row says why
        return {"skipped": str(e)}
    finally:
        server.stop()


def compare(engine, registry, lm, prompts, max_tokens: int) -> dict:
    """The three rows (see the module's docstring) on `prompts`."""
    heads = registry.heads_for(lm)
    out = {"gamma": EAGLE_GAMMA, "ours": ours(engine, lm.name, prompts, max_tokens, EAGLE_GAMMA)}
    shipped = heads["eagle"]
    heads["eagle"] = full_vocabulary_head(registry, lm)
    try:
        out["ours, full vocabulary"] = ours(engine, lm.name, prompts, max_tokens, EAGLE_GAMMA)
    finally:
        heads["eagle"] = shipped
    out["vLLM"] = theirs(prompts, max_tokens, lm.name)
    return out


def tables(r: dict) -> list[str]:
    rows = [[label, f"not measured: {x['skipped']}", None] if "skipped" in x else
            [label, x["mean_acceptance_length"], " / ".join(f"{a:.2f}" for a in x["acceptance_per_position"])]
            for label, x in ((k, r[k]) for k in ("ours", "ours, full vocabulary", "vLLM"))]
    return [table(["drafting", "mean acceptance length", "acceptance per position"], rows,
                  f"Our EAGLE head in vLLM (its EAGLE layout), γ = {r['gamma']}, greedy, the same held-out questions")]
