"""For the stage (issue 32), in a real Chromium against real servers: an old link on a page that opens on SmolLM2
plays on a model that can, and the address the page then keeps reproduces it; a phone that watches sees the status
and the stream in its first screen; a run downloaded as a page plays from disk with the network off."""
from __future__ import annotations

import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from e2e.test_playground import open_page, url, wait_state
from live_server import serve

pytestmark = pytest.mark.browser
SMOLLM2 = "smollm2-135m"
FORM_FIELDS = ("model", "method", "num_speculative_tokens", "draft_confidence_threshold", "chat", "max_tokens",
               "temperature", "kv_cache_dtype", "prompt")


@pytest.fixture(scope="module")
def smollm2_home(models_dir):
    """A server whose page opens on SmolLM2 (config demo "auto"), or a skip where it is not fetched."""
    from app.config import AppConfig
    from app.main import create_app
    from cli.fetch import FetchError, fetch_model

    try:
        fetch_model(SMOLLM2, log=lambda *a: None)
    except FetchError as e:
        pytest.skip(f"SmolLM2-135M cannot be had here: {e}")
    with serve(create_app(AppConfig(models_dir=models_dir))) as base:
        yield base


def form_values(page) -> dict:
    return page.evaluate("""names => Object.fromEntries(names.map(n => {
        const el = document.querySelector('#controls [name="' + n + '"][data-default]')
        return [n, el.type === 'checkbox' ? String(el.checked) : el.value]
    }))""", list(FORM_FIELDS))


def test_an_old_slide_link_asking_for_a_draft_model_plays_on_smollm2_and_its_address_reproduces_it(smollm2_home, page):
    open_page(page, smollm2_home + "/?prompt=def%20__init__(self,%20&method=draft_model&autoplay=1&speed=max"
                                   "&max_tokens=30")
    assert page.locator(".note-banner, .warning-banner").count() == 0    # SmolLM2, the page's own, has a draft
    assert form_values(page)["model"] == SMOLLM2 and form_values(page)["method"] == "draft_model"
    wait_state(page, "done", 120)                                        # autoplay: it plays
    assert page.locator("#stream .tok[data-token-status]").count() > 0
    assert page.get_attribute("#kv-draft-grid", "data-pool") == "draft:smollm2-135m-draft"
    page.select_option("#speed", "25")                    # a control changes: the address follows the form
    query = urllib.parse.parse_qs(urlsplit(page.url).query)
    assert "model" not in query and query["method"] == ["draft_model"]   # SmolLM2's own default is EAGLE
    before = form_values(page)
    open_page(page, page.url)
    assert form_values(page) == before and page.locator(".note-banner, .warning-banner").count() == 0


def test_switching_models_keeps_the_address_a_faithful_copy(smollm2_home, page):
    open_page(page, smollm2_home + "/")
    assert form_values(page)["model"] == SMOLLM2 and "model=" not in page.url    # SmolLM2 is the page's own default
    page.select_option("#f-model", "target-mha")
    page.wait_for_selector("#f-chat:disabled")            # target-mha has no chat template: unticked, disabled
    page.select_option("#f-num_speculative_tokens", "6")
    before = form_values(page)
    assert before["chat"] == "false" and before["method"] == "eagle"            # target-mha has an EAGLE head too
    open_page(page, page.url)
    assert form_values(page) == before and page.locator(".warning-banner").count() == 0, page.url


FIRST_SCREEN = """() => {
  const box = el => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height} }
  const tok = document.querySelector('#stream .tok')
  return {scrollY: scrollY, height: innerHeight, status: box(document.getElementById('run-status')),
          stream: box(document.getElementById('stream-wrap')), tok: tok && box(tok),
          tabs: box(document.querySelector('.teach-tabs'))}
}"""


def test_a_phone_that_watches_sees_the_status_and_the_first_token_in_its_first_screen(live_server, browser,
                                                                                      artifacts_dir):
    presenter_ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    phone_ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                    device_scale_factor=2)
    try:
        presenter = presenter_ctx.new_page()
        open_page(presenter, url(live_server, speed="5", max_tokens=60, prompt="def parse(line):\n    "))
        phone = phone_ctx.new_page()
        open_page(phone, live_server + presenter.get_attribute("#watch-link", "href"))
        presenter.click("#btn-toggle")
        phone.wait_for_selector("#stream .tok", timeout=60_000)
        seen = phone.evaluate(FIRST_SCREEN)
        assert seen["scrollY"] == 0, seen
        assert 0 <= seen["status"]["top"] and seen["status"]["bottom"] <= seen["height"], seen
        assert seen["tok"]["height"] > 0 and seen["tok"]["bottom"] <= seen["height"], seen     # the first token
        assert seen["tabs"]["top"] >= seen["stream"]["bottom"], seen              # the views' tabs come after it
        phone.screenshot(path=str(artifacts_dir / "stage-phone-watcher.png"))
        wait_state(phone, "done", 90)
        phone.click("#tab-theory")                                               # the views are still there
        phone.wait_for_selector("#view-theory:not([hidden])")
    finally:
        presenter_ctx.close()
        phone_ctx.close()


# --- a run saved as one page ------------------------------------------------------------------------------------------
TOKEN_STATUSES = "() => Array.from(document.querySelectorAll('#stream .tok'), t => t.dataset.tokenStatus)"


def open_offline(browser, path: Path, query: str = ""):
    """The saved page from disk in a fresh context with the network off and every request but the file itself
    refused (and listed): (page, the requests it made, its console errors)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720}, offline=True)
    own = path.resolve().as_uri()
    requests, errors = [], []

    def route(r):
        requests.append(r.request.url)
        if r.request.url.split("?")[0] == own:
            r.continue_()
        else:
            r.abort()
    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(own + query)
    page.wait_for_selector("#btn-toggle:not([disabled])")
    return page, requests, errors


def test_a_run_downloaded_as_a_page_plays_from_disk_with_no_network(live_server, page, browser, tmp_path,
                                                                    artifacts_dir):
    open_page(page, url(live_server, prompt="def parse(line):\n    ", max_tokens=240, speed="max", temperature="0.8",
                        seed="3", num_speculative_tokens="4", presenter=1, view="replay"))
    page.click("#btn-toggle")
    wait_state(page, "done", 120)
    live = page.evaluate(TOKEN_STATUSES)
    assert len([s for s in live if s != "rejected"]) == 240 and {"accepted", "rejected"} <= set(live), live
    page.wait_for_selector("#run-recording[data-complete='1'] #page-link")
    with page.expect_download() as download:
        page.click("#page-link")
    saved = tmp_path / "run.html"
    download.value.save_as(saved)
    assert "presenter=1" in download.value.url and "speed=max" in download.value.url      # as the page looked
    size = saved.stat().st_size
    assert size < 200_000, size                            # docs/teaching.md: about 105 KB

    # the CLI turns the JSON export into the same page, its frames as plain JSON this time
    export = page.get_attribute("#export-link", "href")
    recording = tmp_path / "run.json"
    recording.write_bytes(urllib.request.urlopen(live_server + export, timeout=30).read())
    plain = tmp_path / "run-plain.html"
    r = subprocess.run([sys.executable, "-m", "cli.main", "export-page", str(recording), "-o", str(plain), "--plain",
                        "--speed", "max", "--presenter"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and plain.stat().st_size > size, r.stderr

    for path in (saved, plain):
        offline, requests, errors = open_offline(browser, path)
        try:
            assert offline.evaluate("document.body.classList.contains('presenter')")       # large type, as asked
            offline.keyboard.press("Space")                                     # play to the end
            offline.wait_for_selector("#playground[data-player='done']", timeout=60_000)
            assert offline.evaluate(TOKEN_STATUSES) == live, path.name          # the live run's statuses
            assert offline.get_attribute("#run-status", "data-state") == "done"
            assert "240 tokens" in offline.inner_text("#run-status")
            offline.screenshot(path=str(artifacts_dir / f"stage-saved-page-{path.stem}.png"))

            offline.keyboard.press("r")                                         # from the start, by keyboard
            assert offline.locator("#stream .tok").count() == 0
            for _ in range(3):
                offline.keyboard.press("ArrowRight")                            # one round at a time
            assert offline.get_attribute("#playground", "data-player") == "paused"
            shown = offline.evaluate(TOKEN_STATUSES)
            assert 0 < len(shown) < len(live) and shown == live[:len(shown)]
            assert offline.get_attribute("#run-status", "data-round") == "1"   # started, the prefill, round 1

            speed = offline.input_value("#speed")
            offline.keyboard.press("-")                                         # slower, by keyboard
            assert offline.input_value("#speed") != speed
            offline.keyboard.press("Space")
            offline.wait_for_selector("#playground[data-player='playing']")
            offline.keyboard.press("Space")
            assert offline.get_attribute("#playground", "data-player") == "paused"

            offline.keyboard.press("+")
            offline.keyboard.press("+")
            offline.keyboard.press("Space")
            offline.wait_for_selector("#playground[data-player='done']", timeout=60_000)
            assert offline.evaluate("(w => w.scrollHeight > w.clientHeight + 50)(document.getElementById('stream-wrap'))")
            box = offline.locator("#stream-wrap").bounding_box()
            offline.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            offline.mouse.wheel(0, -400)                                        # the reader scrolls back
            offline.wait_for_selector("#stream-latest", state="visible")       # "latest ↓"
            offline.keyboard.press("End")                                       # back to the newest token
            offline.wait_for_selector("#stream-latest[hidden]", state="attached")
            assert offline.evaluate("() => { const w = document.getElementById('stream-wrap');"
                                    " return w.scrollHeight - w.clientHeight - w.scrollTop <= 4 }")
            assert requests == [path.resolve().as_uri()] and errors == [], (requests, errors)
        finally:
            offline.context.close()

    # /embed's layouts apply, from the file's own address too
    offline, requests, errors = open_offline(browser, saved, "?layout=stream&theme=dark")
    try:
        assert offline.get_attribute("body", "data-layout") == "stream"
        assert offline.get_attribute("html", "data-theme") == "dark" and offline.locator(".kv-panel").is_hidden()
        offline.keyboard.press("Space")
        offline.wait_for_selector("#playground[data-player='done']", timeout=60_000)
        assert offline.evaluate("document.documentElement.scrollHeight <= innerHeight + 1")    # the slide fits
        assert offline.evaluate(TOKEN_STATUSES) == live and errors == []
        offline.screenshot(path=str(artifacts_dir / "stage-saved-page-layout-stream.png"))
    finally:
        offline.context.close()
