"""The page loads in a real browser, from our own origin only, with htmx and its websocket extension."""

from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("path", ["/", "/embed"])
def test_page_loads_htmx_from_our_origin_without_errors(live_server, page, artifacts_dir, path):
    response = page.goto(live_server + path, wait_until="networkidle")
    assert response is not None and response.status == 200

    assert page.title() == "Decoding Playground"
    assert page.evaluate("typeof window.htmx") == "object"
    assert page.evaluate("window.htmx.version").startswith("2.")
    assert page.locator("#stream").is_visible()
    page.wait_for_selector("#conn[data-connected='1']")     # the websocket is open (our origin: accepted)

    name = "index" if path == "/" else path.strip("/")
    page.screenshot(path=str(artifacts_dir / f"page-smoke-{name}.png"), full_page=True)

    assert page.recorder.errors == []
    requested_hosts = {urlsplit(url).hostname for url in page.recorder.requests}
    assert requested_hosts == {"127.0.0.1"}, page.recorder.requests
    requested_paths = {urlsplit(url).path for url in page.recorder.requests}
    assert {"/static/vendor/htmx.min.js", "/static/vendor/ws.js", "/static/app.css", "/static/playground.js",
            "/ws"} <= requested_paths
