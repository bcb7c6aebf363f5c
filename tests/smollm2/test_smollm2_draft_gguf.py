"""SmolLM2's shipped draft model as a GGUF for llama.cpp (engine/model/gguf_export.py, written by fetch-model): its
full-vocabulary LM head, read back by our GGUF reader, and run by llama.cpp as the draft of SmolLM2's GGUF."""
import json
import os

import gguf
import numpy as np
import pytest

from engine.external.llamacpp_draft import draft_counts, greedy_answer
from engine.external.openai_stream import run_coroutine
from engine.external.llamacpp_server import EmbeddedLlamaCpp, draft_gguf, gguf_path, unavailable_reason
from engine.model.checkpoint import init_weights, save_checkpoint
from engine.model.config import ModelConfig
from engine.model.fetched import CATALOGUE, cache_dir
from engine.model.fetched import gguf_path as target_gguf
from engine.model.gguf import read_gguf
from engine.model.gguf_export import draft_gguf_path, ensure_draft_gguf
from engine.model.llama import Model, forward
from engine.model.shipped_drafts import DRAFTS_DIR, full_vocabulary_head, load_draft

NAME = "smollm2-135m"
PROMPT = "Explain glaciers in simple terms."


def test_no_row_outside_the_subset_wins_for_any_hidden_state():
    """Rows of S kept; the others the mean of S's rows (float16), below the best of S for random hidden states and
    for the ones that favour an outside row most: its own direction, and halfway to each row of S."""
    rng = np.random.default_rng(0)
    head = rng.standard_normal((300, 8)).astype(np.float16)                          # [V, C]
    ids = rng.choice(300, 40, replace=False)
    full = full_vocabulary_head(head, ids)
    outside = np.setdiff1d(np.arange(300), ids)
    assert full.dtype == np.float16 and np.array_equal(full[ids], head[ids])
    np.testing.assert_allclose(full[outside], np.broadcast_to(head[ids].astype(np.float64).mean(0), (260, 8)),
                               atol=2e-3)                                            # float16's rounding of the mean
    row = full[outside[0]].astype(np.float64)
    h = np.vstack([rng.standard_normal((5000, 8)), row, (row + head[ids]) / 2])     # [n, C]
    logits = h @ full.astype(np.float64).T                                           # [n, V]
    assert (logits[:, outside].max(axis=1) < logits[:, ids].max(axis=1)).all()


def test_a_subset_whose_rows_do_not_span_the_hidden_space_is_refused():
    """Five rows in 8 dimensions: some hidden state gives them all one logit, which the mean row then ties."""
    head = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float16)
    with pytest.raises(ValueError, match="do not span"):
        full_vocabulary_head(head, [0, 1, 2, 3, 4])


def test_a_draft_gguf_is_written_once_and_again_when_the_draft_is_newer(smollm2_dir, tmp_path):
    """A small draft of SmolLM2's vocabulary in a folder of drafts: its GGUF read back has its weights (Q and K rows
    through llama.cpp's order and back), its head over the whole vocabulary; an up-to-date GGUF is kept."""
    cfg = ModelConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=32, vocab_size=49152, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    weights = {k: v.astype(np.float16) for k, v in init_weights(cfg, seed=3).items()}
    folder, subset = tmp_path / "drafts" / "tiny", np.arange(2, 202)
    save_checkpoint(folder, cfg, weights)
    (folder / "vocab_subset.json").write_text(json.dumps(subset.tolist()))
    target, said = target_gguf(CATALOGUE[NAME]), []
    assert ensure_draft_gguf("other", target, tmp_path, tmp_path / "drafts") is None             # none shipped
    out = ensure_draft_gguf("tiny", target, tmp_path, tmp_path / "drafts", log=said.append)
    back_cfg, back, _ = read_gguf(out)
    assert back_cfg == cfg.replace(tie_word_embeddings=False)
    for name, w in weights.items():
        assert np.array_equal(back[name], w), name
    assert np.array_equal(back["lm_head.weight"][subset], weights["model.embed_tokens.weight"][subset])
    made = out.stat().st_mtime_ns
    assert ensure_draft_gguf("tiny", target, tmp_path, tmp_path / "drafts", log=said.append) == out
    assert out.stat().st_mtime_ns == made and len(said) == 1
    os.utime(folder / "model.safetensors", ns=(made + 10**9,) * 2)
    ensure_draft_gguf("tiny", target, tmp_path, tmp_path / "drafts", log=said.append)
    assert out.stat().st_mtime_ns > made and len(said) == 2 and not list(out.parent.glob("*.tmp-*"))


@pytest.fixture(scope="module")
def draft_file(smollm2_dir):
    """The GGUF fetch-model wrote (smollm2_dir fetched it), where llama.cpp's server looks for it."""
    path = draft_gguf()
    assert path == draft_gguf_path(NAME, cache_dir()) and path.is_file()
    return path


def test_our_reader_reads_back_the_draft_gguf_with_the_engines_logits(draft_file, tokenizer):
    """Tolerances: the same float16 weights on both sides, so S's logits differ only by the order of the sums in the
    LM head's product (atol 1e-4 on logits up to about 20); the other tokens' logit is the mean of S's, off by
    the float16 rounding of the mean row (atol 5e-3). The greedy choice is the same at every position."""
    cfg, weights, _ = read_gguf(draft_file)
    assert not cfg.tie_word_embeddings and weights["lm_head.weight"].shape == (cfg.vocab_size, cfg.hidden_size)
    ours = load_draft(DRAFTS_DIR / NAME)                                             # the engine's: its head over S
    ids = np.array(tokenizer.encode(tokenizer.chat_template.prompt(PROMPT) + "Glaciers are large masses of ice"))
    got, want = forward(Model(cfg, weights), ids, 0, None), forward(ours, ids, 0, None)   # [n, V], [n, Vs]
    subset = ours.lm_head_ids
    outside = np.setdiff1d(np.arange(cfg.vocab_size), subset)
    np.testing.assert_allclose(got[:, subset], want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got[:, outside], np.broadcast_to(want.mean(axis=1, keepdims=True), got[:, outside].shape),
                               rtol=0, atol=5e-3)
    assert np.array_equal(got.argmax(axis=1), subset[want.argmax(axis=1)])


def test_the_draft_gguf_carries_the_targets_tokenizer(draft_file, gguf_reader):
    """llama.cpp takes a draft only when its vocabulary is the target's: every tokenizer field is copied."""
    draft = gguf.GGUFReader(str(draft_file))
    keys = [k for k in gguf_reader.fields if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.tokens" in keys and "tokenizer.chat_template" in keys
    assert [k for k in draft.fields if k.startswith("tokenizer.")] == keys
    for k in keys:
        assert draft.fields[k].types == gguf_reader.fields[k].types
        assert draft.fields[k].contents() == gguf_reader.fields[k].contents(), k


def test_llamacpp_answers_with_the_draft_model_and_its_acceptance_is_read(draft_file, tmp_path):
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(reason)
    server = EmbeddedLlamaCpp.start(gguf_path(), threads=1, parallel=1, draft=draft_file, cache=tmp_path)
    try:
        summary = run_coroutine(greedy_answer(server.engine, PROMPT, 48))
    finally:
        server.close()
    assert summary["text"].strip() and server.engine.description["speculative_method"] == "draft_model"
    drafted, accepted = draft_counts(summary["engine_timings"])
    assert 0 < accepted <= drafted <= 4 * 48, summary["engine_timings"]             # γ = 4 a step, some kept
    log = server.log_path.read_text()
    assert server.log_path.name == "llamacpp-draft-1t.log" and f"loading draft model '{draft_file}'" in log
