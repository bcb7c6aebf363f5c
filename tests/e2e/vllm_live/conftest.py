"""vLLM itself, live: one set of vLLM servers (plain, n-gram, our EAGLE head) for every test in this folder.

It is under tests/e2e for the browser test: one Playwright (tests/e2e/conftest.py's) serves a whole session.
"""
import json
import time
import urllib.request

import pytest
from live_server import serve

from app.config import AppConfig
from app.main import create_app
from engine.external.vllm_server import default_venv, unavailable_reason
from engine.model.fetched import cache_dir, fetched_models, is_fetched, model_dir
from engine.serving.registry import InferenceEngine, ModelRegistry

VLLM_READY_TIMEOUT_S = 540.0         # within pytest-timeout's 600 s for the test that starts them


@pytest.fixture(scope="package")
def vllm_app(models_dir):
    """A real app with its vLLM servers (plain, n-gram, our EAGLE head: app/ws/vllm.py), all ready: started once
    for this folder's tests, stopped after its last one (3 x 3.6 GB: not held through the rest of the suite; the
    draft-model server starts alone, in tests/smollm2/test_vllm_draft_model_live.py).
    SKIPPED, loudly, only where vLLM is not installed (make vllm)."""
    reason = unavailable_reason(default_venv(cache_dir()), model_dir("smollm2-135m"))
    if reason:
        pytest.skip(f"!!! vLLM tests SKIPPED: {reason} !!!")
    app = create_app(AppConfig(models_dir=models_dir, vllm=True, embedded_llamacpp=False, demo="character",
                               vllm_variants=("plain", "ngram", "eagle")))
    with serve(app) as base_url:
        deadline = time.monotonic() + VLLM_READY_TIMEOUT_S
        while True:
            with urllib.request.urlopen(base_url + "/api/models", timeout=5) as r:
                ours = [m for m in json.loads(r.read())["models"] if m.get("engine") == "vllm"]
            failed = [f"{m['name']}: {m['error']}" for m in ours if m["state"] == "failed"]
            assert ours and not failed, f"vLLM did not start: {failed or 'no vLLM server offered'}"
            if all(m["ready"] for m in ours):
                break
            assert time.monotonic() < deadline, f"vLLM not ready after {VLLM_READY_TIMEOUT_S:g} s: {ours}"
            time.sleep(1.0)
        yield base_url, app


@pytest.fixture(scope="package")
def smollm2_engine():
    """Our engine serving the fetched SmolLM2 (the weights vLLM serves), for the cross-checks."""
    if not is_fetched("smollm2-135m"):
        pytest.skip("!!! SmolLM2-135M is not fetched (make fetch): vLLM's cross-checks SKIPPED !!!")
    return InferenceEngine(ModelRegistry(fetched_models()), max_sessions=2)

