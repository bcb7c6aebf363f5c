"""Suffix decoding on the page, in a real Chromium against a real server: a question asked twice, and the second
asking's draft lane says it drafted from the earlier request, with the match length and each token's frequency
score on hover.

The runs are stepped round by round with the page's Step button, so each round's lane is read at rest however
slow the machine is. The first round of the first asking cannot draft from earlier requests (the prompt is this
test's own and the global tree then holds only the run's first token); the same round of the second asking
follows the first answer.
"""
from __future__ import annotations

import pytest

from e2e.test_audience import step
from e2e.test_playground import open_page, state, url, wait_state

pytestmark = pytest.mark.browser
PROMPT = "def suffix_asked_twice(value):\n    "


def lane_at_round_1(page) -> dict:
    """Step the run (from idle: it starts paused) until the lane shows round 1; the lane then."""
    while int(page.get_attribute("#draft-lane", "data-round") or 0) < 1:
        assert state(page) != "done", "the run ended before its first round"
        step(page, 90.0)
    return page.eval_on_selector("#draft-lane", """lane => ({round: lane.dataset.round, source: lane.dataset.source,
        match: lane.dataset.matchLen, label: lane.querySelector('.lane-label').innerText,
        titles: Array.from(lane.querySelectorAll('.chip[data-score]'), c => c.title)})""")


def test_a_question_asked_again_drafts_from_the_earlier_request(live_server, page, artifacts_dir):
    open_page(page, url(live_server, model="target-mha", method="suffix", num_speculative_tokens=8, max_tokens=60,
                        speed="max", prompt=PROMPT))
    assert page.input_value("#f-method") == "suffix"
    first = lane_at_round_1(page)
    assert first["round"] == "1" and first["source"] != "earlier_requests", first
    page.click("#btn-toggle")                          # on to the end: the answer goes into the global tree
    wait_state(page, "done", 90.0)
    first_text = page.inner_text("#stream")

    page.click("#btn-reset")
    page.wait_for_selector("#run-status[data-state='idle']")
    again = lane_at_round_1(page)
    page.screenshot(path=str(artifacts_dir / "suffix-drafted-from-earlier-request.png"))
    assert again["round"] == "1" and again["source"] == "earlier_requests", again
    assert "from earlier requests" in again["label"] and f"match {again['match']} token" in again["label"]
    assert int(again["match"]) >= 1 and again["titles"]
    assert all(t.startswith("frequency score=") for t in again["titles"]), again["titles"]
    page.click("#btn-toggle")
    wait_state(page, "done", 90.0)
    assert page.inner_text("#stream") == first_text    # greedy: the same answer
    assert page.recorder.errors == []
