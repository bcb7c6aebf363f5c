"""vLLM itself, live (this folder's vLLM servers: conftest.py's `vllm_app`), checked against our engine on
the same SmolLM2 float32 weights: greedy token ids, n-gram drafts per step, and the figures the page derives
from vLLM's stream against vLLM's own per-request metrics and /metrics counters."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from ws_client import connect, get_json, run

from engine.external.openai_stream import stream_chat
from engine.external.server_metrics import accepted_by_position, fetch_server_metrics
from engine.external.vllm_rounds import accepted_per_position
from engine.external.vllm_server import VARIANTS
from engine.serving.session import GenerationSession

NAME = "smollm2-135m"
PLAIN, NGRAM, EAGLE = (VARIANTS[k].label for k in ("plain", "ngram", "eagle"))
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "Explain what a prime number is in one sentence.",
    "Give me a tip for learning to cook.",
    "What is 12 times 12?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "List two uses of a paperclip.",
    "What does a bee make?",
]
COPY_PROMPT = ("Repeat the following list exactly, one item per line: apples, bananas, cherries, dates, "
               "elderberries, figs, grapes.")
SUMMARY_PROMPT = ("Summarize in two sentences: The city council met on Tuesday to discuss the new park. The "
                  "park will have a playground, a pond and a small garden. Work on the park starts in May and "
                  "the park opens in September.")
NGRAM_SETTINGS = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def vllm(vllm_app):
    base_url, app = vllm_app
    return base_url, app.state.playground.external


def ours(engine, prompt, **settings):
    """Our engine's run: (prompt ids, emitted ids, [(drafted, accepted)] of rounds with a draft, summary)."""
    s = GenerationSession(engine, prompt, {"model": NAME, "chat": True, "temperature": 0, **settings})
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    prompt_ids = [t["id"] for t in events[0].prompt_tokens]
    emitted = [e.id for e in events if e.type == "token" and e.status != "rejected"]
    rounds = [(e.num_draft_tokens, e.num_accepted) for e in events if e.type == "round" and e.num_draft_tokens]
    return prompt_ids, emitted, rounds, events[-1].summary


def theirs(engine, prompt, **settings):
    """vLLM's run through our client: its summary (tokens with ids, vllm_rounds) and its prompt ids."""
    async def go():
        prompt_ids, summary, error = None, None, None
        async for e in stream_chat(engine, prompt, {"temperature": 0, **settings}):
            if e.type == "done":
                summary = e.summary
            elif e.type == "error":
                error = e.message
        assert error is None, error
        return summary
    return run(go(), timeout=300)


def test_vllm_variants_are_offered_ready_with_their_settings(vllm):
    base_url, _ = vllm
    models = {m["name"]: m for m in get_json(base_url + "/api/models")["models"]}
    for name in (PLAIN, NGRAM, EAGLE):
        m = models[name]
        assert name.startswith("vLLM") and m["engine"] == "vllm" and m["ready"] is True and m["state"] == "ready"
        assert m["dtype"] == "float32" and m["threads"] >= 1 and m["start_s"] > 0
    assert models[NGRAM]["speculation"]["method"] == "ngram" and models[PLAIN]["speculation"] is None
    assert not any("127.0.0.1" in str(m) for m in models.values()), "a server URL leaked into the model list"


def test_greedy_token_ids_equal_ours_on_chat_prompts(vllm, smollm2_engine):
    """vLLM float32 and our engine, plain greedy decoding: the same prompt ids (its chat template and ours) and
    the same output ids. A divergence is allowed only at a near tie of our logits (float32 sums in another
    order), and the test says where; at least 8 prompts must agree to the end."""
    _, external = vllm
    equal, explained = 0, []
    for prompt in CHAT_PROMPTS:
        prompt_ids, emitted, _, summary = ours(smollm2_engine, prompt, method="none", max_tokens=48)
        got = theirs(external[PLAIN], prompt, max_tokens=48)
        ids = [t["id"] for t in got["tokens"]]
        eos = smollm2_engine.registry.get(NAME).tokenizer.eos_token_id
        emitted = [t for t in emitted if t != eos]
        ids = [t for t in ids if t != eos]
        if ids == emitted:
            equal += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(ids + [None], emitted + [None])) if a != b)
        explained.append(near_tie(smollm2_engine, prompt_ids + emitted[:at], prompt, at, emitted, ids))
    assert equal >= 8, explained
    print(f"{equal} of {len(CHAT_PROMPTS)} prompts identical; diverged: {explained}")


def near_tie(engine, context, prompt, at, emitted, ids) -> str:
    """Our top two logits where the runs part: a divergence only a near tie explains (else the test fails)."""
    from engine.model.llama import forward
    model = engine.registry.get(NAME).model
    logits = forward(model, np.array(context, np.int64), 0, None, last_only=True)[-1]
    top = np.sort(logits)[-2:]
    gap = float(top[1] - top[0])
    assert gap < 1e-3 * abs(float(top[1])), (f"{prompt!r}: ours {emitted[at:at + 3]}, vLLM {ids[at:at + 3]} at "
                                             f"token {at}: top-2 logit gap {gap:.5f}, not a near tie")
    return f"{prompt!r} at token {at}: top-2 logits {top[1]:.5f} and {top[0]:.5f} (a float32 near tie)"


@pytest.mark.parametrize("prompt", [COPY_PROMPT, SUMMARY_PROMPT], ids=["copy", "summary"])
def test_ngram_drafts_and_acceptances_per_step_equal_ours(vllm, smollm2_engine, prompt):
    """Same prompt_lookup_min/max and γ: our n-gram proposer (vLLM's rule: the longest suffix n-gram, its earliest
    earlier occurrence) drafts and gets accepted what vLLM's does, step by step."""
    _, external = vllm
    _, emitted, rounds, _ = ours(smollm2_engine, prompt, max_tokens=64, **NGRAM_SETTINGS)
    got = theirs(external[NGRAM], prompt, max_tokens=64)
    spec = got["engine_metrics"]["speculative_decoding"]
    assert [t["id"] for t in got["tokens"]] == emitted
    assert list(zip(spec["per_step_drafted"], spec["per_step_accepted"])) == rounds
    assert sum(a for _, a in rounds) > 0, "the prompt was meant to get drafts accepted"
    assert got["vllm_rounds"]["agree"] is True, got["vllm_rounds"]["notes"]


def test_figures_from_the_stream_equal_vllms_per_request_metrics_and_metrics_deltas(vllm):
    """The page's acceptance rate, mean acceptance length and per-position acceptance, derived from vLLM's stream,
    equal its per-request figures and how far its /metrics counters moved over the run."""
    base_url, external = vllm
    engine = external[NGRAM]

    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            before = await fetch_server_metrics(engine, client)
            async with connect(base_url) as c:
                await c.send(type="start", prompt=COPY_PROMPT, settings={"model": NGRAM, "max_tokens": 64})
                done = await c.until("done", "error", timeout=240)
            after = await fetch_server_metrics(engine, client)
        return done, before, after
    done, before, after = run(go(), timeout=300)
    assert done["type"] == "done", done
    s = done["summary"]
    rounds = s["vllm_rounds"]
    stream, own = rounds["reconciled"], rounds["vllm"]
    assert rounds["agree"] is True and rounds["merged_chunks"] == 0, rounds["notes"]
    assert (s["acceptance_rate"], s["mean_acceptance_length"]) == (stream["acceptance_rate"],
                                                                   stream["mean_acceptance_length"])
    spec = s["engine_metrics"]["speculative_decoding"]
    assert stream["acceptance_rate"] == pytest.approx(spec["draft_acceptance_rate"])
    assert stream["mean_acceptance_length"] == pytest.approx(spec["mean_acceptance_length"])
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    assert moved["vllm:spec_decode_num_drafts_total"] == own["num_drafts"] == spec["num_spec_steps"]
    assert moved["vllm:spec_decode_num_draft_tokens_total"] == stream["num_draft_tokens"]
    assert moved["vllm:spec_decode_num_accepted_tokens_total"] == stream["num_accepted_tokens"]
    per_pos_moved = accepted_by_position(moved)
    assert per_pos_moved == stream["accepted_per_position"] == accepted_per_position(spec["per_step_accepted"], 4)
    assert s["server_metrics_moved"]["vllm:spec_decode_num_accepted_tokens_total"] == stream["num_accepted_tokens"]


def test_vllm_speculates_with_our_eagle_head_and_keeps_greedy_output(vllm):
    """Our head, exported to vLLM's EAGLE layout: vLLM drafts with it (some drafts accepted) and its greedy
    output is the plain server's, token for token."""
    _, external = vllm
    plain = theirs(external[PLAIN], CHAT_PROMPTS[7], max_tokens=64)
    eagle = theirs(external[EAGLE], CHAT_PROMPTS[7], max_tokens=64)
    assert [t["id"] for t in eagle["tokens"]] == [t["id"] for t in plain["tokens"]]
    spec = eagle["engine_metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] > 0 and spec["num_accepted_draft_tokens"] > 0, spec
    assert set(spec["per_step_drafted"]) == {3}
    assert eagle["vllm_rounds"]["agree"] is True, eagle["vllm_rounds"]["notes"]


def test_the_prompt_tokens_started_shows_are_vllms_own(vllm):
    """`started` shows the prompt's tokens (our tokenizer, SmolLM2's chat template) before vLLM sends its own
    with its first token: they are vLLM's prompt_token_ids, and the run's summary counts as many."""
    _, external = vllm
    engine = external[PLAIN]

    async def go(prompt):
        body = {"model": engine.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1,
                "stream": True, "return_token_ids": True}
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            async with client.stream("POST", engine.base_url + "/chat/completions", json=body,
                                     headers=engine.headers()) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        first = json.loads(line[6:])
                        break
        events = [e async for e in stream_chat(engine, prompt, {"max_tokens": 1})]
        return first["prompt_token_ids"], events[0], events[-1]
    for prompt in (CHAT_PROMPTS[0], SUMMARY_PROMPT):
        vllms, started, done = run(go(prompt), timeout=300)
        assert [t["id"] for t in started.prompt_tokens] == vllms
        assert done.summary["num_prompt_tokens"] == len(vllms) == done.summary["engine_usage"]["prompt_tokens"]


def test_a_start_on_vllm_while_it_is_not_ready_is_refused_with_the_reason():
    """A configured engine that is starting answers a start with an error that says so (nothing hangs)."""
    from app.ws.external import start_external
    from app.protocol import CommandError
    from engine.external.openai_stream import ExternalEngine

    engine = ExternalEngine("vLLM · test", "http://127.0.0.1:9/v1", kind="vllm",
                            description={"state": "starting", "ready": False, "error": None})
    with pytest.raises(CommandError, match="is starting, not ready"):
        run(start_external(None, engine, "Hi", {"max_tokens": 4}, False))
