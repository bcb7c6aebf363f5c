"""SmolLM2's shipped draft heads (models/heads/smollm2-135m): exact greedy output, real acceptance, no leaks."""
import pytest

from engine.session import GenerationSession

NAME = "smollm2-135m"
PROMPTS = ["Explain glaciers in simple terms.", "Write a Python function that rotates a list by k positions."]
TRAINING_PROMPT = "Explain photosynthesis in simple terms."     # in engine/training/head_prompts.py's training set


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_head_greedy_equals_plain_greedy(run_session, method):
    for prompt in PROMPTS:                                           # held out: subjects the heads never saw
        plain, _ = run_session(prompt, chat=True, method="none", max_tokens=40)
        spec, tokens = run_session(prompt, chat=True, method=method, num_speculative_tokens=3, max_tokens=40)
        assert spec["text"] == plain["text"] and spec["num_drafts"] > 0


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_shipped_heads_are_the_trained_ones(run_session, method):
    """On a prompt of their training data the heads propose what SmolLM2 writes (an untrained head: about 1.0).
    How well they do on questions they never saw is `bench heads`' measurement (docs/benchmarks.md)."""
    plain, _ = run_session(TRAINING_PROMPT, chat=True, method="none", max_tokens=40)
    spec, _ = run_session(TRAINING_PROMPT, chat=True, method=method, num_speculative_tokens=3, max_tokens=40)
    assert spec["text"] == plain["text"]
    assert spec["mean_acceptance_length"] > 1.4, (method, spec["mean_acceptance_length"])
    assert spec["target_forward_calls"] < plain["target_forward_calls"]


def test_eagle_gamma_changed_mid_run_keeps_greedy_output(smollm2_engine, run_session):
    plain, _ = run_session(PROMPTS[0], chat=True, method="none", max_tokens=40)
    s = GenerationSession(smollm2_engine, PROMPTS[0], {"model": NAME, "chat": True, "temperature": 0,
                                                       "method": "eagle", "num_speculative_tokens": 2,
                                                       "max_tokens": 40})
    rounds = 0
    for e in s.events():
        if e.type == "round":
            rounds += 1
            if rounds == 2:
                s.update_settings({"num_speculative_tokens": 5})
        if e.type == "done":
            assert e.summary["text"] == plain["text"]
    assert all(m.pool.num_used_blocks == 0 for m in smollm2_engine.managers.values())


def test_heads_restrict_their_vocabulary_and_say_so(smollm2_engine, smollm2):
    heads = smollm2_engine.registry.heads_for(smollm2)
    assert sorted(heads) == ["eagle", "medusa"] and smollm2.meta["heads"] == ["eagle", "medusa"]
    for head in heads.values():
        assert 1000 < len(head.subset) < smollm2.cfg.vocab_size
