"""SmolLM2's shipped draft heads (models/heads/smollm2-135m): exact greedy output, real acceptance, no leaks."""
import pytest

from engine.session import GenerationSession

NAME = "smollm2-135m"
PROMPTS = ["Explain glaciers in simple terms.", "Write a Python function that rotates a list by k positions."]


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_head_greedy_equals_plain_greedy_and_accepts_drafts(run_session, method):
    for prompt in PROMPTS:
        plain, _ = run_session(prompt, chat=True, method="none", max_tokens=40)
        spec, tokens = run_session(prompt, chat=True, method=method, num_speculative_tokens=3, max_tokens=40)
        assert spec["text"] == plain["text"]
        # trained heads propose what the model writes: well above one token per target call (held-out prompts)
        assert spec["mean_acceptance_length"] > 1.5, (method, spec["mean_acceptance_length"])
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
