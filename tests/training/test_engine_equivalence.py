"""The training forward and the engine's inference forward give the same logits: the proof that a
checkpoint trained here runs unchanged in the engine."""
import numpy as np
import pytest

from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model, forward_no_cache
from engine.training import llama


@pytest.mark.parametrize("kv_heads,tie", [(6, False), (2, False), (1, True)])
def test_training_forward_matches_engine(kv_heads, tie):
    cfg = ModelConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=kv_heads,
                      intermediate_size=80, vocab_size=37, max_position_embeddings=64, tie_word_embeddings=tie)
    rng = np.random.default_rng(kv_heads)
    w = init_weights(cfg, seed=kv_heads, std=0.2)
    for k in w:
        if k.endswith("norm.weight"):
            w[k] = (1 + 0.2 * rng.standard_normal(w[k].shape)).astype(np.float32)
    tokens = rng.integers(0, cfg.vocab_size, 40)
    ours, _ = llama.forward(w, cfg, tokens[None, :])
    engine = forward_no_cache(Model(cfg, w), tokens)
    assert ours.dtype == np.float32
    assert np.abs(ours[0] - engine).max() <= 1e-4
