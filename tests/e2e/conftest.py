"""End-to-end fixtures: Debian's Chromium driven by Playwright (the real uvicorn server, `live_server`, is in
tests/conftest.py).

NOTE: the Playwright sync API cannot run inside a running asyncio loop; keep browser tests synchronous.
`playwright install` downloads browsers and fails offline, so we use /usr/bin/chromium (`make browser`).
"""

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--no-sandbox",  # CI runs as root
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (Debian's), or a loud skip when it is not installed."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"!!! BROWSER TESTS SKIPPED: {CHROMIUM} not found. Run `make browser` "
            "(as root: apt-get install -y chromium) to run the end-to-end tests. !!!"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class PageRecorder:
    """What a page did: every request and websocket URL, console errors, uncaught exceptions and failed requests."""

    def __init__(self, page):
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.failed_requests: list[str] = []
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("websocket", lambda websocket: self.requests.append(websocket.url))
        page.on("console", lambda message: message.type == "error" and self.console_errors.append(message.text))
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        page.on("requestfailed", lambda request: self.failed_requests.append(f"{request.url}: {request.failure}"))

    @property
    def errors(self) -> list[str]:
        return self.console_errors + self.page_errors + self.failed_requests


@pytest.fixture
def page(browser):
    """A fresh page in its own context, with a PageRecorder attached as `page.recorder`."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.recorder = PageRecorder(page)
    try:
        yield page
    finally:
        context.close()
