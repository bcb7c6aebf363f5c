"""Watch mode in a real browser: the presenter's page links to a read-only page that follows its runs."""
from __future__ import annotations

import pytest

from e2e.test_playground import PROMPT, open_page, statuses, url, wait_state

pytestmark = pytest.mark.browser


def test_a_watcher_page_follows_the_presenters_run_read_only(live_server, browser, artifacts_dir):
    presenter_ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    watcher_ctx = browser.new_context(viewport={"width": 390, "height": 844})       # a phone
    try:
        presenter = presenter_ctx.new_page()
        open_page(presenter, url(live_server, speed="max", max_tokens=40, prompt=PROMPT))
        watch_href = presenter.get_attribute("#watch-link", "href")
        assert watch_href.startswith("/watch/")

        watcher = watcher_ctx.new_page()
        errors: list[str] = []
        watcher.on("pageerror", lambda e: errors.append(str(e)))
        watcher.on("console", lambda m: m.type == "error" and errors.append(m.text))
        open_page(watcher, live_server + watch_href)
        assert watcher.locator("#controls [data-part='controls']").is_hidden()

        presenter.click("#btn-toggle")
        wait_state(presenter, "done")
        wait_state(watcher, "done")
        presenter_text = presenter.inner_text("#stream")
        assert watcher.inner_text("#stream") == presenter_text        # the same run, token for token
        assert statuses(watcher) == statuses(presenter)
        watcher.screenshot(path=str(artifacts_dir / "watch-phone.png"))
        assert errors == []

        # a watcher that arrives after the run sees it too (the run so far, then what follows)
        late = watcher_ctx.new_page()
        open_page(late, live_server + watch_href)
        wait_state(late, "done")
        assert late.inner_text("#stream") == presenter_text
    finally:
        presenter_ctx.close()
        watcher_ctx.close()
