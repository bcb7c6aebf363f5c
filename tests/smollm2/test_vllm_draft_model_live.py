"""vLLM's `draft_model` with SmolLM2's draft (exported: engine/training/vllm_draft_export.py), live: the server
`serve --vllm` makes for it (app/ws/vllm.py), started alone for this file and stopped after it (one vLLM at a
time: tests/e2e/vllm_live's three are stopped before this folder runs). SKIPPED, loudly, where vLLM is not
installed (make vllm)."""

import pytest

from app.ws.vllm import VllmFleet
from cli.bench.heads import OPEN
from engine.experiments.draft_crosscheck import crosscheck
from engine.external.openai_stream import run_coroutine, stream_chat
from engine.external.vllm_server import DRAFT_GAMMA, default_venv, unavailable_reason
from engine.model.fetched import cache_dir, model_dir
from engine.serving.session import GenerationSession

NAME = "smollm2-135m"
READY_TIMEOUT_S = 540.0              # within pytest-timeout's 600 s for the test that starts it


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    """SmolLM2 with its shipped draft (the registry a server builds)."""
    from engine.serving.registry import InferenceEngine, ModelRegistry
    return InferenceEngine(ModelRegistry.from_dir(), max_sessions=2)


@pytest.fixture(scope="module")
def server(smollm2_dir):
    reason = unavailable_reason(default_venv(cache_dir()), model_dir(NAME))
    if reason:
        pytest.skip(f"!!! vLLM draft-model tests SKIPPED: {reason} !!!")
    fleet = VllmFleet(("draft_model",))
    s = fleet.server("draft_model")
    assert s is not None, "the draft-model variant was not offered (its export failed: see the log)"
    s.start()
    try:
        assert run_coroutine(s.wait_ready(READY_TIMEOUT_S)), s.error
        yield s
    finally:
        s.stop()


def test_the_draft_model_variant_answers_with_our_greedy_text_and_its_steps_are_read(server, engine):
    """Greedy: vLLM drafting with our draft writes plain decoding's tokens (ours), drafts γ at every step after
    the prefill, gets some accepted, and the stream's step reading equals vLLM's own per-step lists."""
    described = server.describe()
    assert described["speculative_method"] == "draft_model" and described["ready"] is True
    assert described["speculation"]["num_speculative_tokens"] == DRAFT_GAMMA
    assert server.engine.name == "vLLM · SmolLM2-135M · draft model (4 draft tokens)"
    eos = engine.registry.get(NAME).tokenizer.eos_token_id
    events = list(GenerationSession(engine, OPEN[0], {"model": NAME, "chat": True, "temperature": 0,
                                                      "max_tokens": 64, "method": "none"}).events())
    plain = [e.id for e in events if e.type == "token" and e.id != eos]

    async def go():
        return [e async for e in stream_chat(server.engine, OPEN[0], {"max_tokens": 64, "temperature": 0.0})]
    done = run_coroutine(go())[-1]
    assert done.type == "done", done
    s = done.summary
    assert [t["id"] for t in s["tokens"] if t["id"] != eos] == plain
    spec = s["engine_metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] > 0 and spec["num_accepted_draft_tokens"] > 0, spec
    assert set(spec["per_step_drafted"]) == {DRAFT_GAMMA}
    rounds = s["vllm_rounds"]
    assert rounds["agree"] is True, rounds["notes"]
    assert rounds["reconciled"]["per_step_accepted"] == spec["per_step_accepted"]


def test_its_per_step_accepted_counts_are_ours_with_the_same_draft(server, engine):
    """Our per-step accepted counts with the draft model against vLLM's with its export, on held-out questions:
    equal once vLLM's last step is read with our stop rule, or the difference named (never unexplained)."""
    r = crosscheck(engine, NAME, server, OPEN[1:4], 64)
    assert r["unexplained"] == 0, [p["why"] for p in r["prompts"]]
    assert r["equal_at_stop"] >= 2, [(p["why"], p["ours"], p["vllm"]) for p in r["prompts"]]
    assert all(p["same_output"] for p in r["prompts"] if p["equal_at_stop"])
