"""Shared test helpers.

NOTE: BLAS is limited to one thread before anything imports numpy: a second BLAS thread on a shared
2-core machine has made engine steps 10-25x slower (see docs/architecture).
"""

import gc
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

PROJECT_DIR = Path(__file__).resolve().parent.parent
ARTIFACTS_DIR = PROJECT_DIR / "test-artifacts"


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory, request) -> Path:
    """The models the app serves in tests: the shipped ones (models/), unless DECODING_PLAYGROUND_MODELS_DIR
    points elsewhere. Tests must not depend on which tokens they write, only on what the engine reports.

    NOTE: while models/ has no index.json (a checkout whose models are still being trained), a random-weight
    stand-in family on disk is used instead, and the run says so loudly at its end.
    """
    from app.config import AppConfig

    path = AppConfig.from_env().models_dir
    if (path / "index.json").is_file():
        return path
    if os.environ.get("DECODING_PLAYGROUND_MODELS_DIR"):
        pytest.fail(f"no models at {path} (index.json), which DECODING_PLAYGROUND_MODELS_DIR names")
    from fixtures_family import write_family

    request.config._models_stand_in = path
    return write_family(tmp_path_factory.mktemp("stand-in-models"))


def pytest_terminal_summary(terminalreporter, config):
    missing = getattr(config, "_models_stand_in", None)
    if missing is not None:
        terminalreporter.write_line(
            f"!!! {missing}/index.json not found: the app's tests ran on a random-weight STAND-IN model family, "
            "not the shipped models. Train them (scripts/train_models.sh) to test the real ones. !!!",
            red=True, bold=True)


@pytest.fixture(scope="session")
def live_server(models_dir):
    """Base URL (http://127.0.0.1:PORT) of a real uvicorn server running the app with the models, a step budget
    of 8 tokens: our small models' prompts prefill in chunks, which the status line and the page must show (by
    default, chunks sized in time, they would run whole once the engine has measured them)."""
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    with serve(create_app(AppConfig(models_dir=models_dir, demo="character", max_num_batched_tokens=8))) as base_url:
        yield base_url


def give_memory_back() -> None:
    """Collect what the tests left behind and hand what it freed back to the system.

    NOTE: the suite's one process makes hundreds of apps; without this it grows past this machine's memory (the
    kernel killed it) and leaves none for the vLLM servers its last tests start. Two things keep a finished app:
    - a server freezes the collector's view after start-up and after each upload it reads (`gc.freeze`), and
      an app is a reference cycle, so one alive at a freeze is never collected: unfrozen here first;
    - most of its arrays sit below glibc's mmap threshold (which rises with each large block freed), so what
      they freed stays in the process's malloc arenas until trimmed."""
    from engine.kv.store import trim_freed_memory

    gc.unfreeze()
    gc.collect()
    trim_freed_memory()


@pytest.fixture(autouse=True, scope="module")
def _memory_given_back_after_each_module():
    yield
    give_memory_back()


@pytest.fixture
def client():
    """An in-memory client for the app (no real socket: see pitfalls.md before testing websockets with it)."""
    from app.main import create_app

    with TestClient(create_app(), base_url="http://localhost") as client:
        yield client
    give_memory_back()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave screenshots and logs for people to look at (git-ignored)."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR

