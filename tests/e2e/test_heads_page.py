"""Draft heads in the page (real Chromium, real server): the method selector offers EAGLE and Medusa for a model
with heads, a run with each shows tokens of every status, the drafter's pool is the head's own, and the
shoot-out table lists every method."""
from __future__ import annotations

import pytest

from tests.e2e.test_playground import PROMPT, STATUSES, open_page, statuses, url, wait_state

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_selecting_a_head_runs_it_with_tokens_of_every_status(live_server, page, artifacts_dir, method):
    seen: set[str] = set()
    for seed in (0, 1, 2, 3):
        open_page(page, url(live_server, model="target-mha", speed="max", max_tokens=200, temperature=1, seed=seed,
                            num_speculative_tokens=2, prompt=PROMPT))
        assert page.locator(f"#f-method option[value='{method}']").is_enabled()
        page.select_option("#f-method", method)
        page.click("#btn-toggle")
        wait_state(page, "done")
        seen = statuses(page)
        if seen == STATUSES:
            break
    page.screenshot(path=str(artifacts_dir / f"playground-{method}.png"))
    assert seen == STATUSES
    if method == "eagle":   # the head's own paged cache, drawn in the drafter's slot
        assert page.get_attribute("#kv-draft-grid", "data-pool") == "eagle:target-mha-eagle"
    assert page.recorder.errors == []


def test_a_model_without_heads_offers_them_disabled_and_the_shootout_lists_every_method(live_server, page):
    open_page(page, url(live_server, model="target-gqa", prompt=PROMPT))
    assert page.locator("#f-method option[value='eagle']").is_disabled()
    open_page(page, url(live_server, model="target-mha", max_tokens=24, num_speculative_tokens=3, prompt=PROMPT,
                        view="shootout"))
    page.click("#shootout-start")
    page.wait_for_selector(".shootout-table tr[data-method='eagle']", timeout=120_000)
    methods = page.eval_on_selector_all(".shootout-table tbody tr", "els => els.map(e => e.dataset.method)")
    assert methods == ["none", "ngram", "draft_model", "medusa", "eagle", "eagle_tree"]
