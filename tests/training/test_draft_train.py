"""The draft model's distillation (engine/training/draft_train.py): the top-k loss and the sampled LM head against
finite differences, a tiny run that lowers the loss and resumes bit for bit, and its checkpoint read back by the
engine's checkpoint code with the training forward's logits."""
import json

import numpy as np
import pytest

from engine.model.checkpoint import init_weights, load_checkpoint
from engine.model.config import ModelConfig
from engine.model.fetched import is_fetched, model_dir
from engine.model.llama import Model, forward_no_cache
from engine.training import llama, ops
from engine.training.draft_train import (DraftTrainConfig, DraftTrainer, acceptance, get_batch, head_vocabulary,
                                         load_conversations, projected_embedding)
from tests.training.test_ops_gradcheck import TOL, numerical_grad, rel_err

rng = np.random.default_rng(7)


def top_k_rows(n, v, k):  # -> distinct columns [n, k] and probabilities [n, k] (the second row all zero: padding)
    idx = np.stack([rng.permutation(v)[:k] for _ in range(n)])
    p = np.exp(rng.standard_normal((n, k)))
    p /= p.sum(-1, keepdims=True) * 1.25                          # a top-k holds less than all the mass
    p[1] = 0.0
    return idx, p


def test_sparse_soft_cross_entropy():
    logits = rng.standard_normal((5, 9))
    idx, p = top_k_rows(5, 9, 4)
    loss, cache = ops.sparse_soft_cross_entropy_forward(logits, idx, p)
    dense = np.zeros_like(logits)
    np.put_along_axis(dense, idx, p, -1)
    logq = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert np.isclose(loss, -(dense * logq).sum() / 4)           # the padding row does not count
    num = numerical_grad(lambda: float(ops.sparse_soft_cross_entropy_forward(logits, idx, p)[0]), logits)
    assert rel_err(num, ops.sparse_soft_cross_entropy_backward(1.0, cache)) <= TOL


def test_whole_model_with_top_k_targets_and_sampled_head():
    """Tied embeddings: the head's rows get gradient only where they are in head_rows, the embedding's everywhere."""
    cfg = ModelConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=24, vocab_size=13, tie_word_embeddings=True)
    p = {k: v.astype(np.float64) for k, v in init_weights(cfg, seed=3, std=0.3).items()}
    ids = rng.integers(0, 13, (2, 5))
    rows = np.array([0, 2, 3, 5, 7, 8, 11])
    idx, probs = top_k_rows(10, len(rows), 3)
    targets = (idx.reshape(2, 5, 3), probs.reshape(2, 5, 3))
    loss, cache = llama.forward(p, cfg, ids, targets, head_rows=rows)
    grads = llama.backward(cache, cfg)
    assert set(grads) == set(p)
    for name, x in p.items():
        num = numerical_grad(lambda: float(llama.forward(p, cfg, ids, targets, head_rows=rows)[0]), x)
        assert rel_err(num, grads[name]) <= TOL, name


def test_projected_embedding_keeps_the_most_energy():
    e = rng.standard_normal((50, 8)) * np.array([5, 4, 3, 2, 1, 0.5, 0.2, 0.1])
    proj = projected_embedding(e, 3)
    assert proj.shape == (50, 3)
    best = np.linalg.svd(e, compute_uv=False)[:3]
    assert np.allclose(np.linalg.norm(proj, axis=0)[np.argsort(-np.linalg.norm(proj, axis=0))], best, rtol=1e-5)


# --- a tiny teacher and its data ----------------------------------------------------------------------
V, PROMPT = 99, 6             # the character models' vocabulary (models/target-mha's tokenizer), a shared prefix


def write_data(folder, n=48, k=5, seed=0):
    """Conversations after a shared prefix whose next token follows a fixed rule, x' = (3x + 1) mod V, with a
    teacher's top-k: the rule's token at 0.8, four others at 0.05 each."""
    r = np.random.default_rng(seed)
    (folder / "topk").mkdir(parents=True)
    lines = []
    for i in range(n):
        ids = list(range(PROMPT)) + [int(r.integers(PROMPT, V))]
        for _ in range(int(r.integers(10, 30))):
            ids.append((3 * ids[-1] + 1) % V)
        nxt = (3 * np.array(ids[:-1]) + 1) % V
        others = (nxt[:, None] + np.arange(1, k)[None, :] * 7) % V
        np.savez(folder / "topk" / f"{i:05d}.npz", ids=np.concatenate([nxt[:, None], others], 1).astype(np.int32),
                 probs=np.tile(np.array([0.8] + [0.05] * (k - 1), np.float16), (len(nxt), 1)))
        lines.append(json.dumps({"index": i, "prompt": f"p{i}", "kind": "open", "ids": ids, "n_prompt": PROMPT + 1}))
    (folder / "conversations.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def trainer_factory(tmp_path):
    write_data(tmp_path / "data")
    write_data(tmp_path / "heldout", n=8, seed=1)
    target = ModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, vocab_size=V, max_position_embeddings=64, eos_token_id=0, name="tiny")
    embed = np.random.default_rng(0).standard_normal((V, 32)).astype(np.float32)

    def make(state="state", resume=False, **changes):
        tc = DraftTrainConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                              intermediate_size=32, head_dim=8, vocab_subset=20, steps=150, batch_size=4, seq_len=24,
                              lr=3e-2, warmup_steps=5, eval_every=0, ckpt_every=10, log_every=10)
        tc = DraftTrainConfig(**{**tc.__dict__, **changes})
        return DraftTrainer(tc, target, embed, tmp_path / "data", tmp_path / state, tmp_path / "heldout",
                            resume=resume, log=lambda s: None)
    return make


def test_batches_count_after_the_shared_prefix(trainer_factory):
    t = trainer_factory(seq_len=48)                              # whole conversations: windows start at 0
    assert t.count_from == PROMPT                                # the prefix every conversation shares
    ids, top, probs = get_batch(t.convs, t.tc, np.random.default_rng(0), t.count_from, 0)
    counted = probs.sum(-1) > 0                                  # from the prefix's last token, which predicts the rest
    assert not counted[:, :PROMPT - 1].any() and counted[:, PROMPT - 1:11].all()
    assert np.allclose(probs.sum(-1)[counted], 1.0, atol=1e-3)    # renormalised over the k tokens
    vocab, cols = head_vocabulary(t.subset, top, probs)
    assert (vocab[cols][counted] == top[counted]).all()


def test_tiny_run_lowers_the_loss_and_resumes_bit_for_bit(trainer_factory):
    t = trainer_factory()
    before = acceptance(t.st.params, t.cfg, t.held_out, t.subset)["full"]["per_position"][0]
    t.run()
    losses = [h["loss"] for h in t.st.history if "loss" in h]
    assert losses[-1] < losses[0] - 2.0, losses                # from about log(57) to near the teacher's entropy, 0.78
    after = acceptance(t.st.params, t.cfg, t.held_out, t.subset)
    assert after["full"]["per_position"][0] > max(0.9, before + 0.3), (before, after)
    # an interrupted run, resumed from its state file, ends with the same weights
    a = trainer_factory(state="a")
    a.run(stop_at=30)
    with pytest.raises(FileExistsError):
        trainer_factory(state="a")
    b = trainer_factory(state="a", resume=True)
    assert b.st.step == 30
    b.run()
    for k, p in t.st.params.items():
        np.testing.assert_array_equal(p, b.st.params[k], err_msg=k)


def test_acceptance_is_the_engine_greedy_match(trainer_factory):
    """Position 1 of `acceptance` counts answer positions where the engine's own forward's argmax is the next token."""
    t = trainer_factory(steps=20)
    t.run()
    model = Model(t.cfg, t.st.params)
    hits = total = 0
    for c in t.held_out:
        pred = np.argmax(forward_no_cache(model, c.ids[:-1]), -1)
        ok = (pred == c.ids[1:])[c.first:]
        hits, total = hits + ok.sum(), total + len(ok)
    acc = acceptance(t.st.params, t.cfg, t.held_out, t.subset, gamma=1)["full"]
    assert acc["chains"] == total
    assert abs(acc["per_position"][0] - hits / total) < 1e-4


def test_exported_checkpoint_loads_and_gives_the_training_logits(trainer_factory, tmp_path):
    t = trainer_factory(steps=10)
    t.run()
    t.export(tmp_path / "out", model_dir_of_character_models())
    cfg, w, tok = load_checkpoint(tmp_path / "out")             # the code that loads SmolLM2
    assert cfg == t.cfg and tok.vocab_size == V
    assert json.loads((tmp_path / "out" / "vocab_subset.json").read_text()) == t.subset.tolist()
    ids = t.held_out[0].ids
    ours, _ = llama.forward(w, cfg, ids[None])
    engine = forward_no_cache(Model(cfg, w), ids)
    np.testing.assert_allclose(engine, ours[0], rtol=1e-4, atol=1e-4)
    shipped = {k: v.astype(np.float16).astype(np.float32) for k, v in t.st.params.items()}
    np.testing.assert_array_equal(llama.forward(shipped, cfg, ids[None])[0], ours)
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert info["steps"] == 10 and info["held_out"]["conversations"] == 8


def test_a_run_can_start_from_an_exported_draft_and_its_card_says_so(trainer_factory, tmp_path):
    first = trainer_factory(steps=20)
    first.run()
    first.export(tmp_path / "first", None)
    more = trainer_factory(state="more", steps=5, lr=1e-9, init=str(tmp_path / "first"))
    shipped = {k: v.astype(np.float16).astype(np.float32) for k, v in first.st.params.items()}
    for k, p in more.st.params.items():                          # the export's float16 weights, not random ones
        np.testing.assert_array_equal(p, shipped[k], err_msg=k)
    more.run()
    info = more.export(tmp_path / "more", None)
    assert info["init"] == {"from": str(tmp_path / "first"), "steps": 20, "train_s": info["init"]["train_s"],
                            "conversations": 48, "earlier": None}
    from engine.training.draft_card import card
    text = card("tiny", info, None, "Trained further.")
    assert f"Started from the draft then in {tmp_path / 'first'} (20 steps" in text
    assert "projected onto its top principal directions" not in text      # that was the first run's start
    third = trainer_factory(state="third", steps=2, lr=1e-9, init=str(tmp_path / "more"))
    third.run()
    text = card("tiny", third.export(tmp_path / "third", None), None, "Trained further again.")
    assert f"then in {tmp_path / 'more'} (5 steps" in text and "conversations; before them, 20 steps" in text
    with pytest.raises(ValueError, match="hidden_size 16 .this run: 24."):
        trainer_factory(state="wide", hidden_size=24, init=str(tmp_path / "first"))


def model_dir_of_character_models():
    from pathlib import Path
    return Path(__file__).resolve().parents[2] / "models" / "target-mha"


@pytest.mark.skipif(not is_fetched("smollm2-135m"), reason="SmolLM2-135M not fetched (make fetch)")
def test_smollm2_draft_checkpoint_shares_its_tokenizer_and_chat_template(tmp_path):
    target_cfg, target_w, target_tok = load_checkpoint(model_dir("smollm2-135m"))
    write_data(tmp_path / "data", n=4)
    tc = DraftTrainConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=1, num_key_value_heads=1,
                          intermediate_size=64, steps=0)
    t = DraftTrainer(tc, target_cfg, target_w["model.embed_tokens.weight"], tmp_path / "data", tmp_path / "state",
                     log=lambda s: None)
    t.export(tmp_path / "out", model_dir("smollm2-135m"))
    cfg, w, tok = load_checkpoint(tmp_path / "out")
    assert (cfg.vocab_size, cfg.eos_token_id, cfg.bos_token_id) == (49152, target_cfg.eos_token_id, target_cfg.bos_token_id)
    assert tok.chat_template == target_tok.chat_template
    text = tok.chat_template.prompt("What is tea?")
    assert tok.encode(text) == target_tok.encode(text)
    ids = np.array(tok.encode(text))
    np.testing.assert_allclose(forward_no_cache(Model(cfg, w), ids), llama.forward(w, cfg, ids[None])[0][0],
                               rtol=1e-4, atol=1e-4)


def test_model_card_states_data_losses_and_held_out_acceptance(trainer_factory, tmp_path):
    from engine.training.draft_card import card
    t = trainer_factory(steps=20)
    t.run()
    info = t.export(tmp_path / "out", model_dir_of_character_models())
    text = card("tiny", info, "| c table |", "A first run.")
    assert text.splitlines()[2] == "A first run." and "| c table |" in text
    assert f"{info['data']['answer_tokens']:,} answer tokens" in text
    per = info["held_out"]["full"]["per_position"]
    assert " / ".join(f"{x:.2f}" for x in per) in text
    losses = [h["loss"] for h in info["history"] if "loss" in h]
    assert f"loss (nats) by step: 10: {losses[0]:.2f}, 20: {losses[-1]:.2f}." in text


def test_a_card_written_again_keeps_the_c_table_it_shows(trainer_factory, tmp_path):
    """Training further on a machine whose cache holds no `measure` table keeps the shipped card's measurement."""
    from engine.training.draft_card import card, shipped_c_table
    t = trainer_factory(steps=2)
    t.run()
    info = t.export(tmp_path / "out", None)
    measured = "| draft | parameters | step (ms) |\n|---|---|---|\n| 4 x 256 | 7.3 M | 2.11 |\n\nHost: a CPU."
    (tmp_path / "out" / "README.md").write_text(card("tiny", info, measured, "A first run."))
    assert shipped_c_table(tmp_path / "out" / "README.md") == measured
    assert shipped_c_table(tmp_path / "missing.md") is None
    (tmp_path / "out" / "README.md").write_text(card("tiny", info, None, "No measurement."))
    assert shipped_c_table(tmp_path / "out" / "README.md") is None

def test_measure_c_times_every_candidate_against_the_target():
    """The structure of the measurement (timings themselves are the machine's: not asserted)."""
    from engine.training.draft_shape import DraftShape, c_table, kv_heads_for, largest_within, measure_c
    assert [kv_heads_for(h) for h in (128, 192, 256, 384, 576)] == [1, 1, 2, 2, 3]
    target = ModelConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=256, vocab_size=500, max_position_embeddings=64, head_dim=64)
    shapes = [DraftShape(1, 128, 1, 100), DraftShape(2, 128, 1, 500)]
    rows = measure_c(Model(target, init_weights(target)), target, shapes, context=20, rounds=3, gamma=2,
                     log=lambda s: None)
    assert [r["shape"] for r in rows[:-1]] == shapes and rows[-1]["rounds"] == 3
    assert all(r["c_min"] <= r["c"] <= r["c_max"] and r["c"] > 0 for r in rows[:-1])
    assert rows[1]["label"] == "2 x 128, 2/1 heads, MLP 320, LM head full"
    assert c_table(rows).count("\n| 1 x 128") == 1
    assert largest_within(rows, c_max=float("inf"))["shape"] == shapes[1]
    assert largest_within(rows, c_max=0.0) is None


def test_no_held_out_subject_or_task_is_in_any_training_prompt():
    """The held-out figures measure unseen subjects only while no training prompt names one, also the draft's
    wider subjects (a word boundary: "tea" is in "teach")."""
    import re
    from engine.training.head_prompts import (HELD_OUT_CODE_TASKS, HELD_OUT_SUBJECTS, draft_train_prompts,
                                              held_out_prompts, more_train_prompts, train_prompts)
    training = "\n".join(train_prompts() + more_train_prompts() + draft_train_prompts())
    named = [s for s in HELD_OUT_SUBJECTS + HELD_OUT_CODE_TASKS if re.search(rf"\b{re.escape(s)}\b", training)]
    assert named == []
    assert not set(held_out_prompts()) & set(training.split("\n"))
    assert len(set(draft_train_prompts())) == len(draft_train_prompts()) > len(more_train_prompts())
