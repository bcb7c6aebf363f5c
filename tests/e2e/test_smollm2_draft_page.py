"""SmolLM2's draft model in the page (real Chromium, real server): the link asking for it opens with it, a sampled
run shows accepted and rejected tokens, and the drafter's KV pool is the draft's own."""
from __future__ import annotations

import pytest

from tests.e2e.test_audience import smollm2_available
from tests.e2e.test_playground import open_page, statuses, url, wait_state

pytestmark = pytest.mark.browser


def test_a_link_to_smollm2_with_its_draft_model_plays_accepted_and_rejected_tokens(live_server, page, artifacts_dir):
    seen: set[str] = set()
    for seed in (0, 1, 2):
        open_page(page, url(live_server, model="smollm2-135m", method="draft_model", chat="true", temperature=1,
                            seed=seed, max_tokens=48, speed="max", prompt="Explain glaciers in simple terms."))
        if not smollm2_available(page):
            pytest.skip("SmolLM2-135M is not in the model cache here (`make fetch` could not fetch it)")
        assert page.input_value("#f-method") == "draft_model" and page.locator(".warning-banner").count() == 0
        page.click("#btn-toggle")
        wait_state(page, "done", timeout_s=240)
        seen = statuses(page)
        if {"accepted", "rejected"} <= seen:
            break
    page.screenshot(path=str(artifacts_dir / "playground-smollm2-draft-model.png"))
    assert {"accepted", "rejected"} <= seen, seen
    assert page.get_attribute("#kv-draft-grid", "data-pool") == "draft:smollm2-135m-draft"
    assert page.recorder.errors == []
