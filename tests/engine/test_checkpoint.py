"""Checkpoints in the Hugging Face layout and the character tokenizer."""
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine.model.checkpoint import CheckpointError, init_weights, load_checkpoint, save_checkpoint
from engine.model.config import ModelConfig
from engine.model.llama import Model, forward_no_cache
from engine.model.tokenizer import TextTokenizer, UnknownCharactersError

TEXT = "def f(x):\n    return x + 1  # ok\n"


@pytest.fixture
def saved(tmp_path):
    cfg = ModelConfig.from_name("tiny").replace(vocab_size=40)
    tok = TextTokenizer.char_level(TEXT)
    weights = init_weights(cfg, seed=3)
    save_checkpoint(tmp_path / "m", cfg, weights, tok)
    return tmp_path / "m", cfg, weights


def test_round_trip(saved):
    path, cfg, weights = saved
    cfg2, w2, tok = load_checkpoint(path)
    assert cfg2 == cfg
    assert set(w2) == set(weights)
    for k in weights:   # stored as float16: equal to float16 rounding
        np.testing.assert_allclose(w2[k], weights[k].astype(np.float16).astype(np.float32))
    tokens = tok.encode("def f(x):")
    assert tok.decode(tokens) == "def f(x):"
    logits = forward_no_cache(Model(cfg2, w2), tokens)
    assert logits.shape == (len(tokens), cfg.vocab_size) and np.isfinite(logits).all()
    hf = json.loads((path / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["num_key_value_heads"] == cfg.num_key_value_heads


def test_the_weights_are_as_readable_as_the_config(saved):
    """Another user (the Docker image's, given the cache as a volume) reads what the config's mode allows."""
    path = saved[0]
    mode = {f.name: f.stat().st_mode & 0o777 for f in path.iterdir()}
    assert mode["model.safetensors"] == mode["config.json"] and mode["config.json"] & 0o004, mode


def test_tokenizer_json_is_read_by_the_tokenizers_library(saved):
    path, _, _ = saved
    lib = Tokenizer.from_file(str(path / "tokenizer.json"))
    ours = TextTokenizer.from_file(path / "tokenizer.json")
    assert lib.encode(TEXT).ids == ours.encode(TEXT)
    assert lib.decode(lib.encode(TEXT).ids) == TEXT


def test_unknown_characters_policy():
    tok = TextTokenizer.char_level(TEXT)
    ids = tok.encode("fé€")
    assert tok.decode(ids) == "f\ufffd\ufffd" and ids[1] == tok.unk_token_id
    with pytest.raises(UnknownCharactersError, match=r"'é' \(U\+00E9\), '€' \(U\+20AC\)"):
        tok.encode("fé€", strict=True)


@pytest.mark.parametrize("damage,message", [
    (lambda p: (p / "config.json").unlink(), r"config.json: file not found"),
    (lambda p: (p / "config.json").write_text("{nope"), r"config.json: not valid JSON"),
    (lambda p: (p / "model.safetensors").write_bytes(b"garbage"), r"model.safetensors: not a readable"),
    (lambda p: (p / "tokenizer.json").unlink(), r"tokenizer.json: file not found"),
    (lambda p: (p / "config.json").write_text(json.dumps(
        {**json.loads((p / "config.json").read_text()), "hidden_size": 64})), r"has shape .* implies"),
    (lambda p: (p / "config.json").write_text(json.dumps(
        {k: v for k, v in json.loads((p / "config.json").read_text()).items() if k != "vocab_size"})),
     r"missing fields \['vocab_size'\]"),
])
def test_malformed_checkpoint_is_a_clear_error(saved, damage, message):
    path, _, _ = saved
    damage(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)
