"""The page, in Chromium, running a chat on the embedded llama.cpp server (xllamacpp, the SmolLM2 GGUF)."""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from engine.llamacpp_server import LABEL, gguf_path, unavailable_reason

from .test_playground import open_page, url, wait_state


@pytest.fixture(scope="module")
def llamacpp_server(models_dir):
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! llama.cpp page test SKIPPED: {reason} !!!")
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    app = create_app(AppConfig(models_dir=models_dir, embedded_llamacpp=True))
    with serve(app) as base_url:
        assert LABEL in app.state.playground.external, "the app did not start llama.cpp (see its log)"
        yield base_url


def test_a_chat_on_llamacpp_reaches_done_in_the_page(llamacpp_server, page, artifacts_dir):
    open_page(page, url(llamacpp_server, speed="max", max_tokens=12, prompt="Name three colours."))
    page.select_option("#f-model", LABEL)
    page.click("#btn-toggle")
    wait_state(page, "done", timeout_s=120)
    page.wait_for_selector("#summary:not([hidden])")
    page.screenshot(path=str(artifacts_dir / "playground-llamacpp-done.png"))
    statuses = set(page.eval_on_selector_all("#stream [data-token-status]", "els => els.map(e => e.dataset.tokenStatus)"))
    assert statuses == {"target"}
    info = page.inner_text("#model-info")
    assert "an external engine (llamacpp, 1 thread(s))" in info and "the server says: model_ftype Q4_1" in info
    assert "tokens/s by the engine's own clock" in page.inner_text("#summary")
    assert "its KV cache is the server's own" in page.inner_text("#kv-target-grid")
    assert page.recorder.errors == []
    assert {urlsplit(u).hostname for u in page.recorder.requests} == {"127.0.0.1"}
