import numpy as np
import pytest

import engine  # noqa: F401  (pins BLAS threads before numpy work)
from engine.checkpoint import init_weights
from engine.config import ModelConfig
from engine.model import Model


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
