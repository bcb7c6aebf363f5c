"""Suffix decoding on SmolLM2: greedy output equals plain decoding's, and a question asked again in the same words
drafts from the first answer (long rounds, far fewer target forwards)."""
from engine.spec_decode.suffix import SOURCE_EARLIER
from engine.spec_decode.suffix_caches import SuffixCaches

QUESTION = "Explain how a rainbow forms, in a short paragraph."


def test_suffix_greedy_equals_plain_and_a_repeat_drafts_from_the_first_answer(smollm2_engine):
    from engine.serving.session import GenerationSession

    kept, smollm2_engine.suffix_caches = smollm2_engine.suffix_caches, SuffixCaches()    # trees of this test only
    try:
        def run(**settings):
            s = GenerationSession(smollm2_engine, QUESTION, {"model": "smollm2-135m", "chat": True,
                                                             "temperature": 0, "max_tokens": 48, **settings})
            events = list(s.events())
            assert events[-1].type == "done", events[-1]
            return events[-1].summary, [e for e in events if e.type == "draft"]

        plain, _ = run(method="none")
        first, _ = run(method="suffix", num_speculative_tokens=16)
        again, drafts = run(method="suffix", num_speculative_tokens=16)
    finally:
        smollm2_engine.suffix_caches = kept
    assert first["text"] == plain["text"] == again["text"]
    assert any(d.origin["source"] == SOURCE_EARLIER for d in drafts)
    assert again["mean_acceptance_length"] > 4 > first["mean_acceptance_length"]
    assert again["target_forward_calls"] * 3 < plain["target_forward_calls"]


def test_a_first_asking_with_the_acceptance_schedule_gives_plain_greedy_text(smollm2_engine):
    """Nothing cached, the `acceptance` schedule on: where it turns speculation off and probes it again, the text
    stays plain decoding's."""
    from engine.serving.session import GenerationSession

    kept, smollm2_engine.suffix_caches = smollm2_engine.suffix_caches, SuffixCaches()    # trees of this test only
    try:
        def run(**settings):
            s = GenerationSession(smollm2_engine, "Name three rivers in Europe and say one thing about each.",
                                  {"model": "smollm2-135m", "chat": True, "temperature": 0, "max_tokens": 64,
                                   **settings})
            events = list(s.events())
            assert events[-1].type == "done", events[-1]
            return events[-1].summary, [e.values["num_speculative_tokens"] for e in events if e.type == "metrics"]

        plain, _ = run(method="none")
        first, gammas = run(method="suffix", num_speculative_tokens=16, num_speculative_tokens_schedule="acceptance")
    finally:
        smollm2_engine.suffix_caches = kept
    assert first["text"] == plain["text"]
    assert gammas[0] == 16 and set(gammas) <= {0, 1, 3, 7, 16}
