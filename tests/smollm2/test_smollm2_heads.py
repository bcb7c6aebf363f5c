"""SmolLM2's shipped draft heads (models/heads/smollm2-135m): exact greedy output, real acceptance, no leaks."""
import pytest

from engine.serving.session import GenerationSession

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


def test_heads_stream_their_weights_like_the_target(smollm2_engine, smollm2):
    """The heads' matrices take the target's weight layout (engine/model/layout.py), chosen by measurement at load;
    their drafts equal those of the same weights as plain arrays."""
    import numpy as np

    from engine.kv.cache import KVCacheManager
    from engine.model.llama import forward
    from engine.spec_decode.heads import load_heads
    eagle = smollm2_engine.registry.heads_for(smollm2)["eagle"]
    assert eagle.model.layout == smollm2.model.layout != "arrays"
    plain = load_heads(smollm2.name, smollm2.cfg, smollm2.model.embed, smollm2.path)["eagle"]
    assert plain.model.layout == "arrays"
    feats = np.random.default_rng(0).standard_normal((6, smollm2.cfg.hidden_size)).astype(np.float32)
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    tokens = [1, 2, 3, 4, 5, 6]
    logits = []
    for head in (eagle, plain):
        mgr = KVCacheManager(head.cfg, num_blocks=4, block_size=16, enable_prefix_caching=False)
        seq = mgr.new_sequence()
        first = forward(head.model, tokens[:5], 0, mgr.append_slots(seq, tokens[:5]),
                        inputs_embeds=head.inputs(feats[:5], tokens[:5]))                  # the catch-up rows
        one = forward(head.model, tokens[5:], 5, mgr.append_slots(seq, tokens[5:]),
                      inputs_embeds=head.inputs(feats[5:], tokens[5:]))                    # a draft step
        logits.append(np.concatenate([first, one]))
    np.testing.assert_allclose(logits[0], logits[1], rtol=0, atol=1e-3 * np.abs(logits[1]).max())
    assert (logits[0].argmax(axis=1) == logits[1].argmax(axis=1)).all()
    medusa = smollm2_engine.registry.heads_for(smollm2)["medusa"]
    plain = load_heads(smollm2.name, smollm2.cfg, smollm2.model.embed, smollm2.path)["medusa"]
    assert type(medusa.lm_head).__name__ != type(plain.lm_head).__name__ == "ndarray"
    a, b = medusa.logits(feats[0]), plain.logits(feats[0])
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * np.abs(b).max())
    assert (a.argmax(axis=1) == b.argmax(axis=1)).all()
