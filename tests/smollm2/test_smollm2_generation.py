"""SmolLM2 in our engine: a right answer, cached == uncached, speculative greedy == plain greedy, the session's rules."""
import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.model.checkpoint import load_checkpoint
from engine.model.layout import LAYOUTS
from engine.model.llama import Model, forward, forward_no_cache
from engine.serving.settings import SettingsError

SUMMARY_PROMPT = (
    "Summarize this paragraph in one sentence.\n\nThe Great Barrier Reef is the world's largest coral reef "
    "system, composed of over 2,900 individual reefs and 900 islands stretching for over 2,300 kilometres. "
    "The reef is located in the Coral Sea, off the coast of Queensland, Australia.")


def test_greedy_answer_through_the_chat_template_names_paris(run_session):
    summary, tokens = run_session("What is the capital of France?", chat=True, method="none", max_tokens=24)
    assert "Paris" in summary["text"], summary["text"]
    assert summary["finish_reason"] == "stop" and summary["text"].endswith("<|im_end|>")   # EOS from the metadata
    assert "".join(t.text for t in tokens) == summary["text"]
    assert summary["model"]["num_attention_heads"] == 9 and summary["kv_cache"]["num_kv_heads"] == 3
    # 30 layers x K and V x 3 KV heads x 64 dims x 4 bytes (float32)
    assert summary["kv_cache"]["bytes_per_token"] == 30 * 2 * 3 * 64 * 4


def test_cached_logits_equal_uncached_logits(smollm2, tokenizer):
    model, cfg = smollm2.model, smollm2.cfg
    ids = np.array(tokenizer.encode(tokenizer.chat_template.prompt("Name three colours.")))
    full = forward_no_cache(model, ids)                                   # [T, V], no cache
    mgr = KVCacheManager(cfg, num_blocks=8, block_size=16)
    seq = mgr.new_sequence()
    split = len(ids) - 6
    paged = [forward(model, ids[:split], 0, mgr.append_slots(seq, ids[:split]))]       # prefill
    paged += [forward(model, ids[p:p + 1], p, mgr.append_slots(seq, ids[p:p + 1]))     # decode steps
              for p in range(split, len(ids) - 3)]
    paged.append(forward(model, ids[-3:], len(ids) - 3, mgr.append_slots(seq, ids[-3:])))   # a verify round
    paged = np.concatenate(paged)
    np.testing.assert_allclose(paged, full, rtol=1e-4, atol=2e-3)
    assert (paged.argmax(-1) == full.argmax(-1)).all()


def test_the_loaded_model_uses_the_layout_measured_faster(smollm2):
    model = smollm2.model
    assert model.layout == min(model.layout_ms, key=model.layout_ms.get)
    assert isinstance(model.lm_head, LAYOUTS[model.layout])


def test_ngram_greedy_equals_plain_greedy_and_saves_target_calls(run_session):
    plain, _ = run_session(SUMMARY_PROMPT, chat=True, method="none", max_tokens=40)
    spec, tokens = run_session(SUMMARY_PROMPT, chat=True, method="ngram", max_tokens=40, num_speculative_tokens=4,
                               prompt_lookup_min=2, prompt_lookup_max=4)
    assert spec["text"] == plain["text"]
    assert spec["num_accepted_tokens"] > 0 and spec["target_forward_calls"] < plain["target_forward_calls"]
    assert "".join(t.text for t in tokens if t.status != "rejected") == spec["text"]
    assert "".join(t["text"] for t in spec["tokens"]) == spec["text"]


def test_draft_model_and_kv_head_variants_are_refused_with_the_reason(smollm2_engine):
    from engine.serving.session import GenerationSession

    with pytest.raises(SettingsError, match="method: no draft model shares .*49,152 tokens.*ngram"):
        GenerationSession(smollm2_engine, "Hi", {"model": "smollm2-135m", "method": "draft_model"})
    with pytest.raises(SettingsError, match="num_kv_heads: 1 is not available .*part of the trained weights"):
        GenerationSession(smollm2_engine, "Hi", {"model": "smollm2-135m", "method": "none", "num_kv_heads": 1})
    s = GenerationSession(smollm2_engine, "Hi", {"model": "smollm2-135m", "method": "ngram", "num_kv_heads": 3,
                                                 "chat": True})
    with pytest.raises(SettingsError, match="num_kv_heads: 6 is not available"):
        s.update_settings({"num_kv_heads": 6})
    with pytest.raises(SettingsError, match="method: no draft model"):
        s.update_settings({"method": "draft_model"})
    tail = smollm2_engine.registry.get("smollm2-135m").tokenizer.encode("<|im_start|>assistant\n")
    assert s.prompt_ids[:1] == [1] and s.prompt_ids[-len(tail):] == tail      # the chat template was applied
    s.close()


def test_streamed_text_is_whole_characters(run_session):
    """Byte-level tokens end inside characters (北 is three bytes, written by two tokens here): the streamed
    pieces hold the bytes back until the character is whole, and join to exactly the output."""
    summary, tokens = run_session("Repeat exactly: 東京 and 北京 and café.", chat=True, method="none", max_tokens=12)
    pieces = [t.text for t in tokens]
    assert "北京" in summary["text"] and "".join(pieces) == summary["text"]
    assert "" in pieces and "\ufffd" not in summary["text"]
    assert "北" in pieces and not any("\\x" in p for p in pieces)


def test_the_chat_template_s_own_prompt_tokens_are_marked(smollm2_engine):
    """The page collapses the template (system prompt, control tokens): the rest of the prompt is the user's text."""
    from engine.serving.session import GenerationSession

    question = "What is the capital of France?"
    events = list(GenerationSession(smollm2_engine, question, {"model": "smollm2-135m", "chat": True,
                                                               "method": "none", "max_tokens": 1}).events())
    tokens = events[0].prompt_tokens
    assert "".join(t["text"] for t in tokens if not t.get("template")) == question
    assert "".join(t["text"] for t in tokens if t.get("template")).startswith("<|im_start|>system\n")
    plain = list(GenerationSession(smollm2_engine, question, {"model": "smollm2-135m", "method": "none",
                                                              "max_tokens": 1}).events())
    assert not any(t.get("template") for t in plain[0].prompt_tokens)


def test_a_long_prompt_prefilled_in_chunks_gives_the_unchunked_answer(smollm2_engine):
    """Chunked prefill on the real model: a ~350-token chat prompt through the scheduler in chunks of 32 tokens
    (between steps of a second session) answers exactly as one whole prefill does (greedy)."""
    from cli.bench.faults import LONG_TEXT
    from engine.serving.scheduler import Scheduler
    from engine.serving.session import GenerationSession

    settings = {"model": "smollm2-135m", "chat": True, "method": "none", "max_tokens": 6,
                "enable_prefix_caching": False}
    prompt = LONG_TEXT * 3
    whole = list(GenerationSession(smollm2_engine, prompt, settings).events())[-1].summary
    scheduler = Scheduler(max_num_batched_tokens=32)
    long = GenerationSession(smollm2_engine, prompt, settings)
    other = GenerationSession(smollm2_engine, "Hi", {**settings, "max_tokens": 3})
    events = []
    scheduler.add(long, events.append)
    scheduler.add(other, lambda e: None)
    while scheduler.step():
        pass
    chunks = [e for e in events if e.type == "prefill_progress"]
    assert len(long.prompt_ids) >= 300 and len(chunks) >= len(long.prompt_ids) // 32 - 1
    assert [t["id"] for t in events[-1].summary["tokens"]] == [t["id"] for t in whole["tokens"]]
