"""CI-sized training runs of the `ci-tiny` preset: the loss falls, the checkpoint loads in the engine,
the same seed gives the same weights, and an interrupted run resumed gives the same weights too."""
import json
from dataclasses import replace

import numpy as np
import pytest

from engine.model.checkpoint import load_checkpoint
from engine.model.config import ModelConfig
from engine.model.llama import Model, forward_no_cache
from engine.training import llama
from engine.training.cli import RECIPES, main
from engine.training.corpus import load_corpus
from engine.training.train import TrainConfig, mean_pool_kv, train


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_files=RECIPES["ci-tiny"]["max_files"])


def tiny_config(**changes):
    recipe = {k: v for k, v in RECIPES["ci-tiny"].items()}
    return replace(TrainConfig(preset="ci-tiny", **recipe), **changes)


def test_loss_falls_and_checkpoint_loads(tmp_path, corpus):
    summary = train(tiny_config(), tmp_path / "m", state_dir=tmp_path / "s", corpus=corpus, log=lambda s: None)
    hist = summary["history"]
    assert hist[-1]["val_loss"] < hist[0]["val_loss"] - 0.3
    assert summary["val_loss"] < np.log(99)  # better than uniform over the vocabulary
    cfg, weights, tok = load_checkpoint(tmp_path / "m")
    assert cfg.vocab_size == tok.vocab_size == 99
    logits = forward_no_cache(Model(cfg, weights), tok.encode("def f(x):\n    return x"))
    assert np.isfinite(logits).all()
    assert json.loads((tmp_path / "m" / "training.json").read_text())["steps"] == 30


def test_same_seed_same_weights_and_resume(tmp_path, corpus):
    quiet = lambda s: None  # noqa: E731
    tc = tiny_config(steps=12, eval_every=6, ckpt_every=100)
    train(tc, tmp_path / "a", state_dir=tmp_path / "sa", corpus=corpus, log=quiet)
    train(tc, tmp_path / "b", state_dir=tmp_path / "sb", corpus=corpus, log=quiet)
    assert train(tc, tmp_path / "c", state_dir=tmp_path / "sc", corpus=corpus, log=quiet, stop_at=7) is None
    train(tc, tmp_path / "c", state_dir=tmp_path / "sc", corpus=corpus, log=quiet, resume=True)
    _, wa, _ = load_checkpoint(tmp_path / "a", with_tokenizer=False)
    for other in "bc":
        _, wo, _ = load_checkpoint(tmp_path / other, with_tokenizer=False)
        for k in wa:
            np.testing.assert_array_equal(wa[k], wo[k], err_msg=f"{other}: {k}")


def test_mean_pool_kv_groups_consecutive_heads():
    src = ModelConfig(hidden_size=12, num_hidden_layers=1, num_attention_heads=6, num_key_value_heads=6,
                      intermediate_size=8, vocab_size=5)
    dst = src.replace(num_key_value_heads=2)
    k = np.arange(6 * 2 * 12, dtype=np.float32).reshape(12, 12)  # 6 heads of dim 2
    w = {"model.layers.0.self_attn.k_proj.weight": k, "model.layers.0.self_attn.v_proj.weight": k}
    out = mean_pool_kv(w, src, dst)["model.layers.0.self_attn.k_proj.weight"]
    assert out.shape == (4, 12)
    np.testing.assert_allclose(out[:2], k.reshape(6, 2, 12)[:3].mean(0))
    np.testing.assert_allclose(out[2:], k.reshape(6, 2, 12)[3:].mean(0))


def test_cli_help_explains_presets(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for name in RECIPES:
        assert name in text


def test_a_continued_run_keeps_the_record_of_the_stage_before(tmp_path, corpus):
    quiet = lambda s: None  # noqa: E731
    first = train(tiny_config(steps=6, eval_every=3), tmp_path / "a", state_dir=tmp_path / "sa", corpus=corpus, log=quiet)
    second = train(tiny_config(steps=4, eval_every=2, init_from=str(tmp_path / "a")), tmp_path / "b",
                   state_dir=tmp_path / "sb", corpus=corpus, log=quiet)
    stage = second["previous_stage"]
    assert stage["steps"] == 6 and stage["val_loss"] == first["val_loss"]
    assert stage["train_seconds"] == first["train_seconds"]
    assert "previous_stage" not in first


def test_layerwise_distillation_keeps_the_residual_streams_near_the_teachers(tmp_path, corpus):
    """Continuing a teacher with its own distribution as targets: the layer term (distill_hidden) keeps the
    student's residual stream after every layer closer to the teacher's than distillation alone does."""
    quiet = lambda s: None  # noqa: E731
    train(tiny_config(steps=6, eval_every=3), tmp_path / "t", state_dir=tmp_path / "st", corpus=corpus, log=quiet)
    teacher = str(tmp_path / "t")
    cfg, tw, _ = load_checkpoint(teacher, with_tokenizer=False)
    ids = corpus[1][None, :64].astype(np.int64)               # held-out text
    _, t_hidden = llama.forward(tw, cfg, ids)
    errors = {}
    for weight in (0.0, 100.0):
        out = tmp_path / f"s{weight:g}"
        train(tiny_config(steps=6, eval_every=3, lr=3e-2, init_from=teacher, distill_from=teacher,
                          distill_hidden=weight), out, state_dir=tmp_path / f"ss{weight:g}", corpus=corpus, log=quiet)
        _, s_hidden = llama.forward(load_checkpoint(out, with_tokenizer=False)[1], cfg, ids)
        errors[weight] = np.mean([np.mean((s - t) ** 2) / np.mean(t ** 2) for s, t in zip(s_hidden, t_hidden)])
    assert errors[100.0] < 0.5 * errors[0.0], errors


def test_layerwise_distillation_needs_a_teacher_of_the_same_shape(tmp_path, corpus):
    with pytest.raises(ValueError, match="distill_hidden"):
        train(tiny_config(steps=2, distill_hidden=1.0), tmp_path / "m", state_dir=tmp_path / "s", corpus=corpus,
              log=lambda s: None)
