"""The page, in Chromium, watching vLLM's n-gram speculation (this folder's vLLM servers, conftest.py's
`vllm_app`): its steps coloured as ours, the draft lane's "vLLM drafted k, accepted a", the reconciliation at
the end and vLLM's own gauges."""
from __future__ import annotations

import re
from urllib.parse import urlsplit

from engine.external.vllm_server import VARIANTS

from ..test_external_page import assert_panel_shows_the_servers_values
from ..test_playground import open_page, statuses, url, wait_state

NGRAM = VARIANTS["ngram"].label
COPY_PROMPT = ("Repeat the following list exactly, one item per line: apples, bananas, cherries, dates, "
               "elderberries, figs, grapes.")


def test_vllms_rounds_are_coloured_and_reconciled_in_the_page(vllm_app, page, artifacts_dir):
    base_url, _ = vllm_app
    open_page(page, url(base_url, speed="max", max_tokens=48, prompt=COPY_PROMPT))
    page.select_option("#f-model", NGRAM)
    page.wait_for_selector("#f-method[disabled]")                # the server fixed its drafter at start-up
    page.click("#btn-toggle")
    wait_state(page, "done", timeout_s=180)
    page.wait_for_selector("#summary:not([hidden])")
    page.screenshot(path=str(artifacts_dir / "playground-vllm-ngram-done.png"), full_page=True)
    seen = statuses(page)
    assert "accepted" in seen and seen & {"resampled", "bonus"}, seen
    notes = page.inner_text("#notes")
    assert "vLLM's per-step lists:" in notes and "they agree" in notes, notes
    assert re.search(rf"new run on {re.escape(NGRAM)}: [1-9][0-9]* prompt tokens", notes), notes
    assert "the server's prompt" not in notes, notes          # vLLM counted the tokens shown
    assert page.inner_text('[data-server-gauge="Draft tokens accepted"] output') != "–"
    assert page.recorder.errors == []
    assert {urlsplit(u).hostname for u in page.recorder.requests} == {"127.0.0.1"}


def test_the_draft_lane_says_what_vllm_drafted_and_accepted(vllm_app, page):
    base_url, _ = vllm_app
    open_page(page, url(base_url, max_tokens=48, prompt=COPY_PROMPT, speed="2"))
    page.select_option("#f-model", NGRAM)
    page.wait_for_selector("#f-method[disabled]")
    page.click("#btn-toggle")
    lane = page.wait_for_selector("#draft-lane .lane-verdict:has-text('vLLM drafted')", timeout=120_000)
    assert "accepted" in lane.inner_text()
    wait_state(page, "done", timeout_s=180)


def test_the_settings_panel_shows_vllms_values_while_its_chat_run_plays(vllm_app, page):
    """vLLM · SmolLM2-135M · n-gram chosen and its run playing: SmolLM2's 3 KV heads (not our default model's),
    the chat template ticked as the run used it, vLLM's n-gram drafter, the rest "set by the server"."""
    base_url, _ = vllm_app
    open_page(page, url(base_url, max_tokens=48, prompt=COPY_PROMPT, speed="2"))
    page.select_option("#f-model", NGRAM)
    page.wait_for_selector("#f-method[disabled]")
    page.click("#btn-toggle")
    wait_state(page, "running", timeout_s=120)
    assert_panel_shows_the_servers_values(page, method="n-gram lookup")
    page.click("#btn-stop")
