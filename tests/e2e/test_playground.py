"""The playground in a real Chromium against a real uvicorn server (issue 5's "Tests (real browser)").

Waits are conditions with bounded timeouts (Playwright's selector waits, or `wait_until`, which polls from
here because the page's CSP forbids the string evaluation `wait_for_function` uses). Tests depend on what
the engine reports, never on which tokens a model writes. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import functools
import http.server
import json
import threading
import time
import urllib.parse
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

PROMPT = "def parse(line):\n    "
STATUSES = {"accepted", "rejected", "resampled", "bonus", "target"}


def wait_until(page, expression: str, timeout_s: float = 30.0, interval_s: float = 0.05):
    """Poll a JavaScript expression until it is truthy; returns its value (fails after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = page.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {expression}")
        time.sleep(interval_s)


def url(base: str, path: str = "/", **params) -> str:
    return f"{base}{path}?{urllib.parse.urlencode(params)}"


def open_page(page, address: str):
    page.goto(address)
    page.wait_for_selector("#conn[data-connected='1']")
    return page


def state(page) -> str:
    return page.get_attribute("#run-status", "data-state")


def wait_state(page, value: str, timeout_s: float = 60.0) -> None:
    page.wait_for_selector(f"#run-status[data-state='{value}']", timeout=timeout_s * 1000)


def statuses(page) -> set[str]:
    return set(page.eval_on_selector_all("#stream [data-token-status]", "els => els.map(e => e.dataset.tokenStatus)"))


def kv_bytes_formula(models_dir: Path, kv_heads: int, dtype: str) -> int:
    """layers x 2 (K and V) x KV heads x (head_dim x bytes per number + per-token scale bytes), from config.json."""
    index = json.loads((models_dir / "index.json").read_text())
    entries = index["models"] if isinstance(index, dict) else index
    for e in entries:
        cfg = json.loads((models_dir / Path(e["path"]).name / "config.json").read_text())
        if e["role"] == "target" and cfg.get("num_key_value_heads", cfg["num_attention_heads"]) == kv_heads:
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            element, scale = {"auto": (4, 0), "float16": (2, 0), "bfloat16": (2, 0), "fp8_e4m3": (1, 0),
                              "int8_per_token_head": (1, 2)}[dtype]
            return cfg["num_hidden_layers"] * 2 * kv_heads * (head_dim * element + scale)
    raise AssertionError(f"no target with {kv_heads} KV heads in {models_dir}")


def target_kv_heads(models_dir: Path) -> list[int]:
    index = json.loads((models_dir / "index.json").read_text())
    entries = index["models"] if isinstance(index, dict) else index
    heads = []
    for e in entries:
        cfg = json.loads((models_dir / Path(e["path"]).name / "config.json").read_text())
        if e["role"] == "target":
            heads.append(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    return sorted(heads, reverse=True)


# --- the page, a run, every status -------------------------------------------------------------------------
def test_a_run_loads_from_our_origin_only_without_console_errors(live_server, page, artifacts_dir):
    open_page(page, url(live_server, speed="max", max_tokens=60, prompt=PROMPT))
    page.click("#btn-toggle")
    wait_state(page, "done")
    page.wait_for_selector("#summary:not([hidden])")
    page.screenshot(path=str(artifacts_dir / "playground-run-done.png"))
    assert page.recorder.errors == []
    hosts = {urlsplit(u).hostname for u in page.recorder.requests}
    assert hosts == {"127.0.0.1"}, page.recorder.requests
    assert any(u.startswith("ws://127.0.0.1") and urlsplit(u).path == "/ws" for u in page.recorder.requests)


def test_a_run_shows_tokens_of_every_status(live_server, page, artifacts_dir):
    """Sampling with a short γ gives rejections (with their resampled replacement) and fully accepted rounds
    (with a bonus token); the first token is always the target's. Seeds are tried in turn, so the test does
    not depend on which tokens a model writes, only on the engine reporting each status."""
    seen: set[str] = set()
    for seed in (0, 1, 2, 3):
        open_page(page, url(live_server, speed="max", max_tokens=200, method="draft_model", num_speculative_tokens=2,
                            temperature=1, seed=seed, prompt=PROMPT))
        page.click("#btn-toggle")
        wait_state(page, "done")
        seen = statuses(page)
        if seen == STATUSES:
            break
    page.screenshot(path=str(artifacts_dir / "playground-every-status.png"))
    assert seen == STATUSES
    # rejected tokens are struck through and the legend explains every status
    decoration = page.eval_on_selector("#stream [data-token-status='rejected']",
                                       "e => getComputedStyle(e).textDecorationLine")
    assert "line-through" in decoration
    legend = set(page.eval_on_selector_all(".legend [data-token-status]", "els => els.map(e => e.dataset.tokenStatus)"))
    assert legend == STATUSES
    colours = page.eval_on_selector_all(
        ".legend [data-token-status]",
        "els => els.map(e => getComputedStyle(e).borderBottomStyle + getComputedStyle(e).backgroundColor)")
    assert len(set(colours)) == 5                     # each status looks different, not only by hue
    # the summary the page shows agrees with the tokens that arrived
    shown = page.evaluate("window.playgroundStats.tokens")
    assert page.locator("#run-status").inner_text().find(f"{shown} tokens") >= 0


def test_changing_gamma_mid_stream_changes_the_size_of_the_next_rounds(live_server, page, artifacts_dir):
    open_page(page, url(live_server, speed="10", max_tokens=400, method="draft_model", num_speculative_tokens=2,
                        prompt=PROMPT))
    page.click("#btn-toggle")
    page.wait_for_selector("#draft-lane[data-num-draft-tokens='2']", timeout=30_000)
    assert state(page) == "running"
    page.select_option("#f-num_speculative_tokens", "6")
    page.wait_for_selector("#notes .note[data-note='settings_applied']", timeout=30_000)
    applied_round = int(page.get_attribute("#notes .note[data-note='settings_applied']", "data-round"))
    page.wait_for_selector("#draft-lane[data-num-draft-tokens='6']", timeout=30_000)
    lane_round = int(page.get_attribute("#draft-lane", "data-round"))
    assert lane_round >= applied_round
    assert page.locator("#draft-lane .chip").count() == 7          # 6 drafts + the target's token
    assert page.locator("#stream .mark[data-note='settings_applied']").count() == 1     # visible where it applied
    assert "γ = 6" in page.locator("#notes .note[data-note='settings_applied']").inner_text()
    page.screenshot(path=str(artifacts_dir / "playground-gamma-changed.png"))
    assert state(page) == "running"                                  # it never stopped
    page.click("#btn-stop")
    wait_state(page, "done")
    assert page.recorder.errors == []


def test_switching_dtype_and_kv_heads_changes_bytes_per_token_to_the_formula(live_server, models_dir, page,
                                                                            artifacts_dir):
    heads = target_kv_heads(models_dir)
    mha, mqa = heads[0], heads[-1]
    open_page(page, url(live_server, speed="10", max_tokens=400, method="none", prompt=PROMPT))
    page.click("#btn-toggle")
    gauge = "#m-kv_bytes_per_token"
    shows = expect(page.locator(gauge)).to_have_text
    shows(str(kv_bytes_formula(models_dir, mha, "auto")), timeout=30_000)

    page.select_option("#f-kv_cache_dtype", "int8_per_token_head")
    shows(str(kv_bytes_formula(models_dir, mha, "int8_per_token_head")), timeout=30_000)
    page.select_option("#f-num_kv_heads", str(mqa))
    expected = kv_bytes_formula(models_dir, mqa, "int8_per_token_head")
    shows(str(expected), timeout=30_000)
    page.select_option("#f-kv_cache_dtype", "float16")
    shows(str(kv_bytes_formula(models_dir, mqa, "float16")), timeout=30_000)
    # the KV map now draws the MQA target's float16 pool, and its bytes in use follow the formula
    page.wait_for_selector("#kv-target-grid[data-kv-cache-dtype='float16']", timeout=30_000)
    page.screenshot(path=str(artifacts_dir / "playground-mqa-float16.png"))
    assert state(page) == "running"
    notes = page.locator("#notes .note[data-note='settings_applied']").all_inner_texts()
    assert any("re-prefilled" in n for n in notes)                  # what the KV-head switch cost
    page.click("#btn-stop")
    wait_state(page, "done")
    assert page.recorder.errors == []


def test_the_kv_map_shows_blocks_freed_after_a_rejection(live_server, page, artifacts_dir):
    """Step mode, small blocks, long drafts: a rejected draft's lookahead blocks are rolled back and freed.
    Sampled (seeded): at temperature 0 the shipped draft agrees with the target on this prompt for 400 tokens."""
    open_page(page, url(live_server, method="draft_model", num_speculative_tokens=16, block_size=8, max_tokens=400,
                        temperature=1.0, seed=1, prompt=PROMPT))
    page.keyboard.press("ArrowRight")                               # step from idle: start, prefill
    page.wait_for_selector("#run-status[data-state='paused'][data-round='0']")
    page.wait_for_selector("#kv-target-grid [data-kv-block]")
    blocks = page.locator("#kv-target-grid [data-kv-block]").count()
    assert blocks > 0
    found = None
    for step in range(1, 41):
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f"#run-status[data-round='{step}']")
        rejected = page.locator("#stream .chunk:last-child .tok[data-token-status='rejected']").count()
        freed = page.eval_on_selector_all("#kv-target-grid [data-event='free']",
                                          "els => els.map(e => [e.dataset.kvBlock, e.dataset.state])")
        if rejected and freed:
            found = freed
            break
    assert found, "no round with a rejection showed a freed target block"
    assert all(state_ in ("free", "cached") for _, state_ in found)   # freed blocks are drawn free
    assert state(page) == "paused"
    page.locator(".kv-panel").screenshot(path=str(artifacts_dir / "playground-kv-freed.png"))
    assert page.locator("#kv-target-grid [data-kv-block]").count() == blocks    # every block of the pool, always
    assert page.locator("#kv-target-grid [data-mine]").count() >= 1
    page.keyboard.press("r")
    wait_state(page, "idle")


def test_keyboard_space_plays_and_pauses_arrow_steps_r_resets(live_server, page):
    open_page(page, url(live_server, speed="5", max_tokens=400, prompt=PROMPT))
    page.keyboard.press("Space")
    wait_state(page, "running")
    page.wait_for_selector("#run-status:not([data-round='0'])")
    page.keyboard.press("Space")
    wait_state(page, "paused")                       # announced once the engine is idle
    paused_at = int(page.get_attribute("#run-status", "data-round"))
    page.keyboard.press("ArrowRight")
    page.wait_for_selector(f"#run-status[data-round='{paused_at + 1}'][data-state='paused']")
    page.keyboard.press("Space")
    wait_state(page, "running")
    page.keyboard.press("r")
    wait_state(page, "idle")
    assert page.locator("#stream .tok").count() == 0
    page.focus("#prompt")                            # typing in the prompt is not a shortcut
    page.keyboard.press("r")
    assert page.input_value("#prompt").count("r") == PROMPT.count("r") + 1
    assert state(page) == "idle"


# --- URL state --------------------------------------------------------------------------------------------------
def test_a_url_with_settings_reproduces_them(live_server, page, artifacts_dir):
    params = dict(method="ngram", num_speculative_tokens=5, temperature=0.8, top_p=0.9, seed=7, max_tokens=40,
                  kv_cache_dtype="fp8_e4m3", block_size=32, enable_prefix_caching="false", prompt_lookup_max=3,
                  prompt="x = 1\nx = 1\nx = ", speed="max", theme="dark", autoplay=1)
    address = url(live_server, **params)
    texts = []
    for _ in range(2):
        open_page(page, address)
        assert page.input_value("#f-method") == "ngram"
        assert page.input_value("#f-num_speculative_tokens") == "5"
        assert page.input_value("#f-temperature") == "0.8" and page.input_value("#f-top_p") == "0.9"
        assert page.input_value("#f-seed") == "7" and page.input_value("#f-max_tokens") == "40"
        assert page.input_value("#f-kv_cache_dtype") == "fp8_e4m3"
        assert page.input_value("#f-block_size") == "32"
        assert page.input_value("#f-prompt_lookup_max") == "3"
        assert not page.is_checked("#f-enable_prefix_caching")
        assert page.input_value("#prompt") == "x = 1\nx = 1\nx = "
        assert page.input_value("#speed") == "max"
        assert page.get_attribute("html", "data-theme") == "dark"
        wait_state(page, "done")                     # autoplay
        page.wait_for_selector("#kv-target-grid[data-kv-cache-dtype='fp8_e4m3'][data-block-size='32']")
        texts.append(page.eval_on_selector_all(
            "#stream .tok", "els => els.map(e => e.dataset.tokenStatus + ':' + e.textContent).join('|')"))
    assert texts[0] and texts[0] == texts[1]         # the same seed writes the same tokens
    page.screenshot(path=str(artifacts_dir / "playground-url-dark.png"))


def test_the_url_follows_the_controls(live_server, page):
    open_page(page, url(live_server, hide="notes", autoplay=0))
    page.select_option("#f-num_speculative_tokens", "9")
    page.fill("#f-seed", "31")
    page.dispatch_event("#f-seed", "change")
    page.select_option("#f-theme", "dark")
    page.select_option("#speed", "2")
    page.uncheck("#f-kv_cache")
    query = urllib.parse.parse_qs(urlsplit(page.url).query)
    assert query["num_speculative_tokens"] == ["9"] and query["seed"] == ["31"]
    assert query["theme"] == ["dark"] and query["speed"] == ["2"] and query["kv_cache"] == ["false"]
    assert query["hide"] == ["notes"]                # kept as the link had it
    assert "method" not in query                     # defaults stay out of the URL
    assert page.get_attribute("html", "data-theme") == "dark"
    # the URL now reproduces the page
    page.goto(page.url)
    assert page.input_value("#f-num_speculative_tokens") == "9" and not page.is_checked("#f-kv_cache")
    assert page.is_hidden(".notes-panel")


def test_a_preset_fills_the_prompt_and_its_settings(live_server, page):
    open_page(page, live_server + "/")
    page.select_option("#preset", "repetitive")
    assert page.input_value("#f-method") == "ngram"
    assert "for name in os.listdir(path):" in page.input_value("#prompt")
    assert "method=ngram" in page.url
    page.select_option("#preset", "nocache")
    assert not page.is_checked("#f-kv_cache") and page.input_value("#f-method") == "none"
    assert page.input_value("#f-max_tokens") == "256"
    page.fill("#f-max_tokens", "32")          # each token recomputes the whole sequence: a short run shows it
    page.select_option("#speed", "max")
    page.click("#btn-toggle")
    wait_state(page, "done")
    assert "KV cache off" in page.inner_text("#kv-target-caption") or \
        page.locator("#kv-target-grid[data-pool='']").count() == 1
    assert page.recorder.errors == []


# --- embedding, presenter, theme -----------------------------------------------------------------------------------
@pytest.fixture
def other_origin(tmp_path, live_server):
    """A page on another origin (localhost, another port) that frames /embed of the live server."""
    embed = url(live_server, "/embed", autoplay=1, speed="max", max_tokens=30, prompt=PROMPT)
    (tmp_path / "host.html").write_text(
        f'<!doctype html><title>Slides</title><link rel="icon" href="data:,"><h1>My talk</h1>'
        f'<iframe id="demo" src="{embed}" width="1200" height="640"></iframe>')
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("localhost", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/host.html"
    finally:
        server.shutdown()
        server.server_close()


def test_embed_renders_inside_an_iframe_served_from_another_origin(other_origin, page, artifacts_dir):
    page.set_viewport_size({"width": 1280, "height": 760})
    page.goto(other_origin)
    frame = page.frame_locator("#demo")
    frame.locator("#run-status[data-state='done']").wait_for(timeout=60_000)
    assert frame.locator("#stream .tok").count() > 0
    assert frame.locator(".site-header").count() == 0
    assert frame.locator("#conn[data-connected='1']").count() == 1      # the websocket: our own origin
    page.screenshot(path=str(artifacts_dir / "playground-embed-other-origin.png"))
    assert page.recorder.errors == []


def test_presenter_mode_is_large_type_and_legible_at_1280x720(live_server, page, artifacts_dir):
    page.set_viewport_size({"width": 1280, "height": 720})
    long_prompt = PROMPT + "x = 1\n" * 30          # 200 tokens in the cache: a 7-digit count of KV bytes
    open_page(page, url(live_server, presenter=1, speed="max", max_tokens=80, prompt=long_prompt, autoplay=1))
    wait_state(page, "done")
    size = page.eval_on_selector("#stream", "e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 26                                # about 1.7rem
    normal = page.context.new_page()
    normal.goto(url(live_server))
    assert normal.eval_on_selector("#stream", "e => parseFloat(getComputedStyle(e).fontSize)") < size
    normal.close()
    # nothing overflows the viewport horizontally, and the status, stream and gauges are in view
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    for selector in ("#run-status", "#stream", "#m-tokens_per_s"):
        box = page.locator(selector).bounding_box()
        assert box and box["y"] < 720 and box["x"] + box["width"] <= 1280, selector
    # every gauge's number on one line, the long byte count included (it wrapped after 6 digits)
    assert len(page.text_content("#m-kv_cache_bytes")) >= 7
    lines = page.eval_on_selector_all(".gauge-value", """els => els.map(e => [e.dataset.metric, e.textContent,
        e.getBoundingClientRect().height / parseFloat(getComputedStyle(e).lineHeight)])""")
    assert all(round(n) == 1 for _, _, n in lines), lines
    page.screenshot(path=str(artifacts_dir / "playground-presenter-1280x720.png"))


def test_full_speed_delivers_every_token_and_the_page_stays_responsive(live_server, page):
    open_page(page, url(live_server, speed="max", max_tokens=300, method="none", prompt=PROMPT))
    page.click("#btn-toggle")
    wait_state(page, "done")
    summary = page.inner_text("#summary")
    arrived = page.evaluate("window.playgroundStats.tokens")
    assert f"{arrived} tokens in" in summary          # every token the engine wrote reached the page
    # when tokens appeared (bench page's gaps): in order, one entry per appearance, at most one per token
    times = page.evaluate("window.playgroundStats.tokenTimes")
    assert 1 <= len(times) <= arrived and times == sorted(times)
    # the page answers at once after streaming (no backlog of swaps)
    t0 = time.monotonic()
    page.select_option("#f-theme", "dark")
    assert page.get_attribute("html", "data-theme") == "dark"
    assert time.monotonic() - t0 < 2.0


def test_the_dom_stays_bounded_on_long_runs(live_server, page):
    """The page drops the oldest tokens, notes and chart points beyond its limits (lowered here to see it)."""
    open_page(page, url(live_server, speed="25", max_tokens=60, method="none", prompt=PROMPT))
    page.evaluate("Object.assign(window.playgroundLimits, {streamChunks: 5, notes: 3})")
    page.click("#btn-toggle")
    wait_state(page, "done")
    page.wait_for_selector("#stream .trimmed")
    assert page.locator("#stream > .chunk").count() <= 5 + 1      # the last frame may not be trimmed yet
    assert page.locator("#notes > li").count() <= 3 + 2
    rounds = page.eval_on_selector_all("#stream .tok", "els => els.map(e => +e.dataset.round)")
    assert rounds and min(rounds) > 10                              # the first rounds are gone
