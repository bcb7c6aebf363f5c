"""Shared test helpers.

NOTE: BLAS is limited to one thread before anything imports numpy: a second BLAS thread on a shared
2-core machine has made engine steps 10-25x slower (see docs/architecture).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

PROJECT_DIR = Path(__file__).resolve().parent.parent
ARTIFACTS_DIR = PROJECT_DIR / "test-artifacts"


@pytest.fixture
def client():
    """An in-memory client for the app (no real socket: see pitfalls.md before testing websockets with it)."""
    from app.main import create_app

    with TestClient(create_app()) as client:
        yield client


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave screenshots and logs for people to look at (git-ignored)."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR
