"""End-to-end fixtures: a real uvicorn server in a thread and Debian's Chromium driven by Playwright.

NOTE: the Playwright sync API cannot run inside a running asyncio loop; keep browser tests synchronous.
`playwright install` downloads browsers and fails offline, so we use /usr/bin/chromium (`make browser`).
"""

import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import uvicorn

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
SERVER_START_TIMEOUT_S = 15.0


def _wait_for_healthz(base_url: str, thread: threading.Thread, timeout_s: float) -> None:
    """Polls /healthz until it answers 200; fails early if the server thread died."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("uvicorn server thread exited during startup (see the log above)")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last_error = error
        time.sleep(0.05)
    raise RuntimeError(f"server at {base_url} not healthy after {timeout_s} s: {last_error!r}")


@pytest.fixture(scope="session")
def live_server():
    """Base URL (http://127.0.0.1:PORT) of a real uvicorn server running the app on a free port."""
    from app.main import create_app

    # Bind the socket ourselves and hand it to uvicorn: no race between picking a port and using it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"

    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-e2e", daemon=True)
    thread.start()
    try:
        _wait_for_healthz(base_url, thread, SERVER_START_TIMEOUT_S)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("uvicorn server thread did not stop within 10 s")


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
    """What a page did: every request URL, console errors, uncaught exceptions and failed requests."""

    def __init__(self, page):
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.failed_requests: list[str] = []
        page.on("request", lambda request: self.requests.append(request.url))
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
