"""The page, in Chromium, running a chat on the embedded llama.cpp server (xllamacpp, the SmolLM2 GGUF)."""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from engine.external.llamacpp_server import LABEL, gguf_path, unavailable_reason

from .test_playground import open_page, url, wait_state


@pytest.fixture(scope="module")
def llamacpp_server(models_dir):
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! llama.cpp page test SKIPPED: {reason} !!!")
    from live_server import serve

    from app.config import AppConfig
    from app.main import create_app

    app = create_app(AppConfig(models_dir=models_dir, embedded_llamacpp=True))
    with serve(app) as base_url:
        assert LABEL in app.state.playground.external, "the app did not start llama.cpp (see its log)"
        yield base_url


def test_a_chat_on_llamacpp_reaches_done_in_the_page(llamacpp_server, page, artifacts_dir):
    open_page(page, url(llamacpp_server, speed="max", max_tokens=12, prompt="Name three colours."))
    page.select_option("#f-num_speculative_tokens", "6")            # our form's values, kept aside while...
    page.select_option("#f-model", LABEL)
    page.wait_for_selector("#f-kv_cache_dtype[disabled]")        # what the server fixed, disabled with its reason
    for control in ("#f-num_kv_heads", "#f-method", "#f-block_size", "#f-num_speculative_tokens", "#f-chat"):
        assert page.is_disabled(control)
        assert "set by the server at start-up" in page.get_attribute(control, "title")
    assert "set by the server at start-up" in page.inner_text("#server-set")
    assert_panel_shows_the_servers_values(page, method="none (plain decoding)")
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
    gauges = page.inner_text("#server-gauges")                      # its own /metrics, beside ours
    generated = page.inner_text('[data-server-gauge="Tokens generated"] output')
    assert "The server's own /metrics" in gauges and int(generated.replace(",", "")) >= 12
    assert page.recorder.errors == []
    assert {urlsplit(u).hostname for u in page.recorder.requests} == {"127.0.0.1"}
    page.select_option("#f-model", "")                              # one of ours again: every control back
    page.wait_for_selector("#f-kv_cache_dtype:not([disabled])")
    assert not page.is_disabled("#f-method") and not page.is_visible("#server-set")
    assert selected_text(page, "#f-num_speculative_tokens") == "6" and "set by the server" not in selected_text(
        page, "#f-kv_cache_dtype")


def selected_text(page, selector: str) -> str:
    return page.eval_on_selector(selector, "el => el.options[el.selectedIndex].text")


def assert_panel_shows_the_servers_values(page, method: str) -> None:
    """With an external engine chosen, every value in the settings panel is the server's or says so: SmolLM2's
    3 KV heads (the weights it serves), the chat template its chat endpoint applies, its drafter; the rest
    "set by the server" (never our form's)."""
    assert selected_text(page, "#f-num_kv_heads") == "3 — GQA"
    assert page.is_checked("#f-chat")
    assert selected_text(page, "#f-method") == method
    for control in ("#f-num_speculative_tokens", "#f-kv_cache_dtype", "#f-block_size"):
        assert selected_text(page, control) == "set by the server", control
    for control in ("#f-prompt_lookup_min", "#f-draft_confidence_threshold"):
        assert page.input_value(control) == "" and page.get_attribute(control, "placeholder") == "set by the server"
    assert page.eval_on_selector("#f-kv_cache", "el => el.indeterminate")
