"""The Shoot-out's row of our EAGLE head in vLLM, live (this folder's vLLM servers: conftest.py's `vllm_app`):
vLLM's own per-request figures for the Shoot-out's prompt, and whether vLLM wrote our plain decoding's text."""
from __future__ import annotations

import re

import httpx
import pytest
from ws_client import run

from engine.external.openai_stream import stream_chat
from engine.external.vllm_rounds import accepted_per_position
from engine.external.vllm_server import EAGLE_GAMMA, VARIANTS
from engine.serving.session import GenerationSession

PROMPT = "Why is the sky blue?"
MAX_TOKENS = 32


def test_the_shootout_shows_vllms_own_acceptance_for_our_head_beside_ours(vllm_app, smollm2_engine):
    base_url, app = vllm_app
    gamma = EAGLE_GAMMA + 1                     # not vLLM's fixed γ: the row must say so
    form = {"prompt": PROMPT, "model": "smollm2-135m", "chat": "true", "temperature": "0", "method": "eagle",
            "max_tokens": str(MAX_TOKENS), "num_speculative_tokens": str(gamma)}
    html = httpx.post(base_url + "/teach/shootout", data=form, timeout=600, trust_env=False).text
    rows = dict(re.findall(r'<tr data-method="(\w+)">(.*?)</tr>', html, re.S))
    assert list(rows)[-3:] == ["eagle", "eagle_tree", "vllm_eagle"], html[:2000]   # below our EAGLE rows
    row = rows["vllm_eagle"]
    assert f"EAGLE (our head) in vLLM, γ = {EAGLE_GAMMA}" in row and 'data-figure="reason"' not in row, row
    assert f"fixed at γ = {EAGLE_GAMMA}, this shoot-out ran γ = {gamma}" in row
    assert "not measured: another process, on another clock" in row

    async def vllms_own():                       # the same request, straight to vLLM
        async for e in stream_chat(app.state.playground.external[VARIANTS["eagle"].label], PROMPT,
                                   {"max_tokens": MAX_TOKENS, "temperature": 0}):
            if e.type in ("done", "error"):
                return e
    done = run(vllms_own(), timeout=300)
    assert done.type == "done", done
    spec = done.summary["engine_metrics"]["speculative_decoding"]
    shown = float(re.search(r'data-figure="mal" data-value="([\d.]+)"', row).group(1))
    assert shown >= 1.0 and spec["num_spec_steps"] > 0
    assert shown == pytest.approx(spec["mean_acceptance_length"], rel=1e-9)
    per_position = row.split('data-figure="mal"')[1].split("<td>")[1].split("</td>")[0]
    steps = spec["num_spec_steps"]
    assert per_position == " / ".join(f"{a / steps:.2f}" for a in accepted_per_position(spec["per_step_accepted"],
                                                                                          EAGLE_GAMMA))

    ours = GenerationSession(smollm2_engine, PROMPT, {"model": "smollm2-135m", "chat": True, "temperature": 0,
                                                      "method": "none", "max_tokens": MAX_TOKENS})
    eos = smollm2_engine.registry.get("smollm2-135m").tokenizer.eos_token_id
    plain = [e.id for e in ours.events() if e.type == "token" and e.id != eos]
    same = [t["id"] for t in done.summary["tokens"] if t["id"] != eos] == plain
    assert re.search(r'data-figure="identical">(\w+)<', row).group(1) == ("yes" if same else "NO")
    ours_l = re.search(r'data-figure="mal">([\d.]+)<', rows["eagle"]).group(1)
    print(f"{PROMPT!r}: mean acceptance length ours {ours_l} (γ {gamma}), vLLM {shown:.2f} (γ {EAGLE_GAMMA}; "
          f"per position {per_position}); vLLM's text {'equals' if same else 'differs from'} our plain text")
