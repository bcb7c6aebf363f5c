"""The page as an audience sees it, in a real Chromium against a real server: the newest token stays in view,
every layout for slides fits its frame, token statuses and draft chips keep 4.5:1 contrast, a race from a URL.

Positions and colours are read from the browser (bounding boxes, computed styles), never assumed. Screenshots of
every layout go to test-artifacts/ (audience-*.png).
"""
from __future__ import annotations

import pytest

from e2e.test_playground import PROMPT, open_page, state, url, wait_state, wait_until

pytestmark = pytest.mark.browser
MODEL = "target-mha"        # our own MHA model and its draft (SmolLM2 has its own test)

TWO_FRAMES = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
ANIMATIONS_ENDED = """Promise.all(document.getAnimations()
  .filter(a => a.effect.getComputedTiming().endTime !== Infinity).map(a => a.finished))"""
# the latency chart drawn at least once (its first draw sets its height, which the layout follows), or not shown
CHART_DRAWN = """() => { const c = document.getElementById('latency-chart')
  return !c || c.clientWidth === 0 || c.style.height !== '' }"""

# Is the last token element inside the stream box's visible area and inside the viewport? (1 px of rounding)
# Measured two frames after the call: the stream follows once per frame, so a token that arrived since the last
# frame is placed in the next one, before it is painted.
NEWEST_IN_VIEW = """async () => {
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))
  const toks = document.querySelectorAll('#stream .tok')
  if (!toks.length) return {tokens: 0, inBox: false, inViewport: false}
  const t = toks[toks.length - 1].getBoundingClientRect()
  const wrap = document.getElementById('stream-wrap')
  const w = wrap.getBoundingClientRect()
  const top = w.top + wrap.clientTop, bottom = top + wrap.clientHeight
  return {tokens: toks.length, top: t.top, bottom: t.bottom, left: t.left, right: t.right,
          boxTop: top, boxBottom: bottom,
          inBox: t.top >= top - 1 && t.bottom <= bottom + 1 && t.height > 0,
          inViewport: t.top >= -1 && t.bottom <= innerHeight + 1 && t.left >= -1 && t.right <= innerWidth + 1}
}"""


def tokens_shown(page) -> int:
    return page.evaluate("document.querySelectorAll('#stream .tok').length")


def step(page, timeout_s: float) -> None:
    """One round (the page's Step button; from idle it starts the run paused), waited for: its tokens are in the
    stream (a round's tokens come in one message, and no other round runs till the next step), or the run ended."""
    before = tokens_shown(page)
    page.click("#btn-step")
    try:
        page.wait_for_function("""before => document.getElementById('run-status').dataset.state === 'done'
          || document.querySelectorAll('#stream .tok').length > before""", arg=before, timeout=timeout_s * 1000)
    except Exception as e:
        raise AssertionError(f"no round after {before} tokens: {page.inner_html('#run-status')!r}") from e


def follow_run(page, marks: list[int], timeout_s: float = 90.0) -> list[dict]:
    """Step the run until the stream holds each of `marks` tokens, then play it to its end: where is its newest
    token at each mark, and at the end?

    Stepped, the run is at rest at each mark (no token arrives between the page's frame and the measurement), and
    it cannot run past a mark or end before it however slow the machine is.
    """
    seen = []
    for mark in marks:
        while tokens_shown(page) < mark:
            assert state(page) != "done", f"the run ended with {tokens_shown(page)} tokens, before {mark}"
            step(page, timeout_s)
        seen.append(page.evaluate(NEWEST_IN_VIEW))
    page.click("#btn-toggle")                          # resume: on to the end at the page's speed
    wait_state(page, "done", timeout_s)
    seen.append(page.evaluate(NEWEST_IN_VIEW))
    return seen


def test_a_400_token_presenter_run_keeps_its_newest_token_in_view(live_server, browser, artifacts_dir):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        open_page(page, url(live_server, "/embed", model=MODEL, presenter=1, max_tokens=400, speed=25))
        seen = follow_run(page, [100, 200, 300])
        assert seen[-1]["tokens"] >= 400
        assert all(s["inBox"] and s["inViewport"] for s in seen), [sorted(s.items()) for s in seen]
        assert page.is_hidden("#stream-latest")
        page.screenshot(path=str(artifacts_dir / "audience-presenter-400.png"))
    finally:
        context.close()


def smollm2_available(page) -> bool:
    return page.locator("#f-model option[value='smollm2-135m']").count() == 1


def test_a_smollm2_chat_answer_is_in_view_and_its_template_collapsed(live_server, browser, artifacts_dir):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        open_page(page, url(live_server, model="smollm2-135m", chat="true", method="ngram", max_tokens=40, speed="max",
                            prompt="Explain in three sentences why the sky is blue."))
        if not smollm2_available(page):
            pytest.skip("SmolLM2-135M is not in the model cache here (`make fetch` could not fetch it)")
        seen = follow_run(page, [8, 18, 28], timeout_s=180)
        assert all(s["inBox"] and s["inViewport"] for s in seen), [sorted(s.items()) for s in seen]
        # the chat template: collapsed to one-line toggles, the user's question shown, the answer after it
        assert page.locator("#stream .tpl-toggle").count() == 2
        assert page.locator("#stream .tpl").first.is_hidden()
        assert "why the sky is blue" in page.inner_text("#stream .prompt-head")
        page.screenshot(path=str(artifacts_dir / "audience-smollm2-chat.png"))
        page.locator("#stream .tpl-toggle").first.click()
        assert page.locator("#stream .tpl").first.is_visible()
        assert "You are a helpful AI assistant" in page.inner_text("#stream .prompt-head")
        assert page.get_attribute("#stream .tpl-toggle >> nth=1", "aria-expanded") == "true"
        if not page.evaluate(NEWEST_IN_VIEW)["inBox"]:                 # the open template pushed the answer down
            page.click("#stream-latest")
            assert page.evaluate(NEWEST_IN_VIEW)["inBox"]
    finally:
        context.close()


def test_scrolling_the_stream_up_stops_following_and_latest_brings_it_back(live_server, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        open_page(page, url(live_server, "/embed", model=MODEL, presenter=1, max_tokens=1000, speed=10,
                            temperature=1, prompt=PROMPT))
        page.click("#btn-toggle")
        wait_until(page, "(w => w.scrollHeight > w.clientHeight + 100)(document.getElementById('stream-wrap'))", 60)
        box = page.locator("#stream-wrap").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, -400)                                      # the reader scrolls back
        page.wait_for_selector("#stream-latest", state="visible")
        top = page.evaluate("document.getElementById('stream-wrap').scrollTop")
        count = tokens_shown(page)
        wait_until(page, f"document.querySelectorAll('#stream .tok').length > {count + 20}")
        assert page.evaluate("document.getElementById('stream-wrap').scrollTop") == top      # not pulled down
        assert not page.evaluate(NEWEST_IN_VIEW)["inBox"]
        page.click("#stream-latest")
        page.wait_for_selector("#stream-latest", state="hidden")
        count = tokens_shown(page)
        wait_until(page, f"document.querySelectorAll('#stream .tok').length > {count + 10}")
        # following again: the newest token in view by a frame's end (tokens keep arriving, so poll a few frames)
        wait_until(page, f"({NEWEST_IN_VIEW})().then(r => r.inBox)", 30)
    finally:
        context.close()


# --- layouts for slides ----------------------------------------------------------------------------------------
# Every element the layout shows: panels, the status line and the teaching view (their boxes, not their text).
LAYOUT_BOXES = """() => {
  const els = document.querySelectorAll('.playground .panel, .playground .run-head, .playground .teach')
  return [...els].filter(e => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden')
    .map(e => { const r = e.getBoundingClientRect()
      return {name: e.dataset.part || e.dataset.viewPanel || e.className, left: r.left, top: r.top,
              right: r.right, bottom: r.bottom} })
}"""
LAYOUT_PARTS = {
    "stream": {"stream", "draft", "gauges", "legend"},
    "kv": {"stream", "draft", "kv"},
    "gauges": {"stream", "draft", "gauges", "chart"},
    "view:race": {"race"},
    "view:theory": {"theory"},
}


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)], ids=["1280x720", "1920x1080"])
@pytest.mark.parametrize("layout", list(LAYOUT_PARTS))
def test_each_layout_fits_its_frame(live_server, browser, artifacts_dir, layout, size):
    width, height = size
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        params = dict(layout=layout, model=MODEL, presenter=1, max_tokens=160, speed="max", autoplay=1)
        if layout == "view:race":
            params.update(race="num_kv_heads", race_b=1, max_tokens=60)
        if layout == "stream":
            params.pop("autoplay")                     # played by the slide's own button (the settings are hidden)
        open_page(page, url(live_server, "/embed", **params))
        if layout == "stream":
            page.click(".slide-buttons [data-press=btn-toggle]")
        if layout == "view:race":
            page.wait_for_selector("#race-result .race[data-state='running']", timeout=60_000)
        else:
            wait_state(page, "done")
            page.wait_for_function(CHART_DRAWN)
            page.evaluate(TWO_FRAMES)
        boxes = page.evaluate(LAYOUT_BOXES)
        shown = {b["name"] for b in boxes}
        assert LAYOUT_PARTS[layout] <= shown, shown
        assert not shown & {"prompt", "controls", "settings", "notes"}
        for b in boxes:
            assert b["left"] >= 0 and b["top"] >= 0 and b["right"] <= width + 0.5 and b["bottom"] <= height + 0.5, b
        assert page.evaluate("document.scrollingElement.scrollHeight") == height
        assert page.evaluate("document.scrollingElement.scrollWidth") == width
        if not layout.startswith("view:"):
            newest = page.evaluate(NEWEST_IN_VIEW)
            assert newest["inBox"] and newest["inViewport"], newest
        if layout == "kv":                             # the map's cells grew, and every one of them is in its box
            cells = page.evaluate("""() => [...document.querySelectorAll('.kv-pool')].map(pool => {
              const grid = pool.querySelector('.kv-grid').getBoundingClientRect(), cells = pool.querySelectorAll('.kv')
              const last = cells[cells.length - 1].getBoundingClientRect()
              return {n: cells.length, size: last.width, inside: last.bottom <= grid.bottom + 0.5} })""")
            assert all(c["n"] > 100 and c["size"] > 9 and c["inside"] for c in cells), cells
        page.screenshot(path=str(artifacts_dir / f"audience-layout-{layout.replace(':', '-')}-{width}x{height}.png"))
    finally:
        context.close()


# --- contrast ----------------------------------------------------------------------------------------------------
# WCAG contrast of an element's text against what is behind it: its own and its ancestors' background colours
# composited (the page's canvas is white or the theme's background), its colour's alpha and every opacity applied.
CONTRAST = """(el) => {
  const rgba = s => { const m = s.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1] }
  const over = (top, bottom) => { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat(1) }
  const chain = []
  for (let e = el; e; e = e.parentElement) chain.push(e)
  let bg = rgba(getComputedStyle(document.documentElement).backgroundColor)
  if (bg[3] < 1) bg = over(bg, [255, 255, 255, 1])
  let opacity = 1
  for (const e of chain.slice().reverse()) {
    const s = getComputedStyle(e)
    bg = over(rgba(s.backgroundColor), bg)
    opacity *= Number(s.opacity)
  }
  const c = rgba(getComputedStyle(el).color)
  const fg = over([c[0], c[1], c[2], c[3] * opacity], bg)
  const linear = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4) }
  const lum = x => 0.2126 * linear(x[0]) + 0.7152 * linear(x[1]) + 0.0722 * linear(x[2])
  const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a)
  return {ratio: (hi + 0.05) / (lo + 0.05), size: parseFloat(getComputedStyle(el).fontSize)}
}"""

# Each draft lane drawn during the run: the contrast and size of each of its chips, the lowest kept per status.
RECORD_CHIPS = """(contrast) => {
  window.chipContrast = {}
  const measure = () => document.querySelectorAll('#draft-lane .chip').forEach(chip => {
    const c = contrast(chip), status = chip.dataset.tokenStatus, seen = window.chipContrast[status]
    if (!seen || c.ratio < seen.ratio) window.chipContrast[status] = {ratio: c.ratio, size: c.size}
  })
  new MutationObserver(measure).observe(document.querySelector('.draft-panel'), {childList: true, subtree: true})
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_token_statuses_and_chips_keep_aa_contrast(live_server, page, theme):
    chips = {}
    # paced: each round is a message of its own, so every round's lane is drawn (at full speed a message holds
    # the rounds of a frame and only the last one's lane is drawn: how many show a rejection is up to timing)
    for method in ("draft_model", "ngram"):            # the n-gram lookup also shows the target's own chips
        open_page(page, url(live_server, "/embed", model=MODEL, theme=theme, presenter=1, method=method, temperature=1,
                            num_speculative_tokens=4, max_tokens=40, speed=1000, prompt=PROMPT))
        page.evaluate(f"(() => {{ const contrast = {CONTRAST}; ({RECORD_CHIPS})(contrast) }})()")
        page.click("#btn-toggle")
        wait_state(page, "done")
        page.evaluate(TWO_FRAMES)                      # whatever the last message still changes, in a frame
        for status, c in page.evaluate("window.chipContrast").items():
            chips[status] = min(chips.get(status, c), c, key=lambda x: x["ratio"])
        if method == "draft_model":
            page.evaluate(ANIMATIONS_ENDED)             # the tokens' arrival animations
            tokens = page.evaluate(f"""(() => {{ const contrast = {CONTRAST}; const out = {{}}
              document.querySelectorAll('#stream .tok').forEach(t => {{
                const c = contrast(t), s = t.dataset.tokenStatus
                if (!out[s] || c.ratio < out[s].ratio) out[s] = c }}); return out }})()""")
    assert set(tokens) == {"target", "accepted", "rejected", "resampled", "bonus"}, tokens
    assert {"accepted", "rejected", "unverified", "resampled", "bonus", "target"} <= set(chips), chips
    measured = {**{f"token {k}": v for k, v in tokens.items()}, **{f"chip {k}": v for k, v in chips.items()}}
    for status, c in measured.items():
        assert c["ratio"] >= 4.5, (theme, status, c)
        assert c["size"] >= 24, (theme, status, c)                   # presenter mode: legible from the back
    assert page.recorder.errors == []


def test_the_phone_watcher_shows_the_lane_and_the_stream_legibly(live_server, browser, artifacts_dir):
    presenter = browser.new_context(viewport={"width": 1280, "height": 800})
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                                has_touch=True)
    try:
        page = presenter.new_page()
        open_page(page, url(live_server, model=MODEL, max_tokens=120, speed="max", temperature=1, prompt=PROMPT))
        watcher = phone.new_page()
        open_page(watcher, live_server + page.get_attribute("#watch-link", "href"))
        page.click("#btn-toggle")
        wait_state(watcher, "done")
        watcher.evaluate(ANIMATIONS_ENDED)                # the last chips' arrival: opacity 1 once it ends
        lane = watcher.evaluate("""(() => { const l = document.getElementById('draft-lane')
          return {proposed: +l.dataset.numDraftTokens, chips: [...l.querySelectorAll('.chip')].map(c => {
            const r = c.getBoundingClientRect(), s = getComputedStyle(c)
            return {visible: r.width > 0 && r.right <= innerWidth && s.opacity === '1' && s.visibility === 'visible',
                    size: parseFloat(s.fontSize)} })} })()""")
        assert len(lane["chips"]) >= lane["proposed"] and all(c["visible"] and c["size"] >= 16 for c in lane["chips"])
        newest = watcher.evaluate(NEWEST_IN_VIEW)
        assert newest["inBox"] and newest["bottom"] > 0
        size = watcher.evaluate("parseFloat(getComputedStyle(document.querySelector('#stream .tok')).fontSize)")
        assert size >= 16
        assert watcher.evaluate("document.scrollingElement.scrollWidth") == 390      # nothing wider than the phone
        assert watcher.locator(".slide-buttons").is_hidden()                        # a watcher cannot play
        watcher.screenshot(path=str(artifacts_dir / "audience-phone-watcher.png"))
    finally:
        presenter.close()
        phone.close()


def test_a_race_of_mha_against_mqa_from_its_url(live_server, models_dir, browser, artifacts_dir):
    from engine.kv.dtypes import kv_bytes_per_token
    from engine.model.checkpoint import load_config

    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        # the configs of the models the server serves (read from their files: no weights loaded here)
        cfg = {"MHA": load_config(models_dir / MODEL), "MQA": load_config(models_dir / "target-mqa")}
        mha = cfg["MHA"].num_key_value_heads
        open_page(page, url(live_server, "/embed", layout="view:race", autoplay=1, model=MODEL,
                            race="num_kv_heads", race_a=mha, race_b=1, max_tokens=60, temperature=0, prompt=PROMPT))
        page.wait_for_selector("#race-result .race[data-state='done']", timeout=60_000)
        assert page.locator("#race-result .race-stream").count() == 2
        assert [page.inner_text(f"#race-result .race-lane[data-lane={s}] h3") for s in "ab"] == \
            [f"MHA ({mha} KV heads)", "MQA (1 KV head)"]
        assert all(page.locator(f"#race-result .race-lane[data-lane={s}] .tok.shown").count() == 60 for s in "ab")
        shown = [int(page.inner_text(f"#race-result .race-lane[data-lane={s}] [data-figure=kv_bytes_per_token]"))
                 for s in "ab"]
        assert shown == [kv_bytes_per_token(cfg["MHA"], "auto"), kv_bytes_per_token(cfg["MQA"], "auto")]
        verdict = page.inner_text("#race-result [data-verdict]")
        assert verdict.startswith(f"MQA (1 KV head): {shown[0] / shown[1]:.1f}× fewer KV bytes/token")
        assert "race=num_kv_heads" in page.url and f"race_a={mha}" in page.url and "race_b=1" in page.url
        assert page.evaluate("document.scrollingElement.scrollHeight") == 720
        page.screenshot(path=str(artifacts_dir / "audience-race-mha-mqa.png"))
    finally:
        context.close()
