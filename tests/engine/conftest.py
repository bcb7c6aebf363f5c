import numpy as np
import pytest

import engine  # noqa: F401  (pins BLAS threads before numpy work)
from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model


def make_model(preset="tiny", seed=0, std=0.2, **changes):
    """A randomly initialised model; std 0.2 gives decisive logits so greedy argmax never ties."""
    cfg = ModelConfig.from_name(preset).replace(**changes)
    weights = init_weights(cfg, seed=seed, std=std)
    return Model(cfg, weights), weights


@pytest.fixture(name="make_model", scope="session")
def make_model_fixture():
    return make_model


@pytest.fixture(scope="session")
def tiny():
    return make_model("tiny")


@pytest.fixture(scope="session")
def seed_target():
    return make_model("seed-target", seed=1)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def family():
    """A small in-memory model family: MHA / GQA / MQA targets, a different draft, and the target's twin
    as a draft (always agrees greedily, so every round ends with a bonus token)."""
    from engine.model.tokenizer import TextTokenizer
    from engine.serving.registry import InferenceEngine, LoadedModel, ModelRegistry

    tok = TextTokenizer.char_level("abcdefghijklmnopqrstuvwxyz ():\n.=_,")
    base = ModelConfig.from_name("tiny").replace(vocab_size=tok.vocab_size, eos_token_id=None)

    def lm(name, role, seed, **kw):
        cfg = base.replace(**kw)
        return LoadedModel(name, role, cfg, Model(cfg, init_weights(cfg, seed=seed, std=0.3)), tok)

    def make(draft="other", blocks_per_pool=None, eos_token_id=None):
        nonlocal base
        base = base.replace(eos_token_id=eos_token_id)
        targets = [lm("t-mha", "target", 1, num_key_value_heads=4), lm("t-gqa", "target", 2, num_key_value_heads=2),
                   lm("t-mqa", "target", 3, num_key_value_heads=1)]
        d = lm("d", "draft", 4, hidden_size=16, num_hidden_layers=1) if draft == "other" else \
            LoadedModel("d", "draft", targets[0].cfg, targets[0].model, tok)
        return InferenceEngine(ModelRegistry(targets + [d]), blocks_per_pool=blocks_per_pool)

    return make
