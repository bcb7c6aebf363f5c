"""A token tree in the draft lane (real Chromium, real server): a link with EAGLE drafting trees on the shipped
character model and its head, stepped round by round; each round's lane draws the tree, every node under its
parent, the accepted path marked and ended by the resampled or bonus token, the caption giving its shape; a node
clicked opens the inspector on the children tried at its parent."""
from __future__ import annotations

import pytest

from tests.e2e.test_playground import PROMPT, open_page, statuses, url, wait_state

pytestmark = pytest.mark.browser

TREE_LANE = """() => {
  const lane = document.querySelector('#draft-lane')
  const shape = lane.querySelector('.lane-shape')
  const chips = [...lane.querySelectorAll('.lane-tree .chip')]
  const parentNode = c => { const up = c.parentElement.parentElement.closest('.tree-branch');
                            const chip = up && up.querySelector(':scope > .chip'); return chip ? chip.dataset.node : null }
  return { round: lane.dataset.round, drafts: lane.dataset.numDraftTokens,
           shape: shape && [shape.dataset.treeDepth, shape.dataset.topk, shape.dataset.budget],
           chips: chips.map(c => ({ node: c.dataset.node || null, status: c.dataset.tokenStatus, parent: parentNode(c),
                                    onPath: c.parentElement.hasAttribute('data-on-path'), title: c.title,
                                    height: c.getBoundingClientRect().height })) }
}"""


def test_a_link_with_a_tree_draws_it_in_the_draft_lane_with_its_accepted_path(live_server, page, artifacts_dir):
    open_page(page, url(live_server, model="target-mha", method="eagle", num_speculative_tokens=3,
                        speculative_eagle_topk=3, speculative_num_draft_tokens=8, temperature=1, seed=3,
                        max_tokens=200, prompt=PROMPT))
    assert page.input_value("#f-speculative_eagle_topk") == "3"           # the form offers the tree's settings
    assert page.input_value("#f-speculative_num_draft_tokens") == "8"
    page.keyboard.press("ArrowRight")                                      # step from idle: start, prefill
    page.wait_for_selector("#run-status[data-state='paused'][data-round='0']")
    seen: set[str] = set()
    for step in range(1, 31):
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f"#draft-lane[data-round='{step}']")
        lane = page.evaluate(TREE_LANE)
        if lane["shape"] is None:             # a round the drafter drew a chain (the lane as a chain's)
            continue
        assert lane["shape"][1:] == ["3", "8"]
        nodes = [c for c in lane["chips"] if c["node"] is not None]
        assert len(nodes) == int(lane["drafts"]) and all(c["height"] > 0 for c in lane["chips"])
        assert all("q=" in c["title"] for c in nodes)
        path = [c for c in nodes if c["status"] == "accepted"]
        assert all(c["onPath"] for c in path)
        assert not any(c["onPath"] for c in nodes if c["status"] != "accepted")
        last = [c for c in lane["chips"] if c["node"] is None]              # the token that ends the path
        assert len(last) == 1 and last[0]["status"] in ("resampled", "bonus") and last[0]["onPath"]
        assert last[0]["parent"] == (path[-1]["node"] if path else None)
        seen |= {c["status"] for c in nodes}
        if path and seen >= {"accepted", "rejected", "unverified"}:
            break
    page.locator(".draft-panel").screenshot(path=str(artifacts_dir / "playground-tree-lane.png"))
    assert seen >= {"accepted", "rejected", "unverified"}, seen
    # a node on the path, clicked: the inspector lists the children tried at its parent, this one marked
    page.click("#draft-lane .lane-tree .chip[data-token-status='accepted'][data-pos]")
    page.wait_for_selector("#inspector .insp-tries tr.inspected-try[data-accepted='1']")
    page.locator("#inspector").screenshot(path=str(artifacts_dir / "playground-tree-inspector.png"))
    assert page.recorder.errors == []


TREE_PAGE = dict(model="target-mha", method="eagle", num_speculative_tokens=2, speculative_eagle_topk=2,
                 speculative_num_draft_tokens=3, max_tokens=24, speed="max", prompt=PROMPT)


def runs_a_chain_then_eagle_gets_the_tree_back(page):
    assert page.input_value("#f-speculative_eagle_topk") == "1"
    assert page.input_value("#f-speculative_num_draft_tokens") == ""
    page.click("#btn-toggle")
    wait_state(page, "done")
    assert page.locator("#error").inner_text().strip() == "" and "accepted" in statuses(page)
    page.select_option("#f-method", "eagle")
    assert page.input_value("#f-speculative_eagle_topk") == "2"
    assert page.input_value("#f-speculative_num_draft_tokens") == "3"
    assert page.recorder.errors == []


def test_choosing_a_method_that_drafts_no_tree_runs_a_chain_and_a_tree_method_brings_the_tree_back(live_server, page):
    """From a page drafting trees (as the demo does where `bench heads` measured a tree fastest), the draft model,
    which drafts chains only, runs without an error, and EAGLE again gets the tree the form had."""
    open_page(page, url(live_server, **TREE_PAGE))
    page.select_option("#f-method", "draft_model")
    runs_a_chain_then_eagle_gets_the_tree_back(page)


def test_a_preset_with_a_chain_method_runs_a_chain_where_the_defaults_are_a_tree(live_server, page):
    """Where the model's defaults draft a tree (SmolLM2's demo at two threads), a preset that restores the defaults
    and picks the draft model runs a chain, not an error; EAGLE again gets the defaults' tree."""
    open_page(page, url(live_server, **TREE_PAGE))
    page.evaluate("""() => {      // this model's defaults made a tree's, as the demo's are at two threads
        document.getElementById('f-speculative_eagle_topk').dataset.default = '2'
        document.getElementById('f-speculative_num_draft_tokens').dataset.default = '3' }""")
    page.select_option("#preset", "code")
    assert page.input_value("#f-method") == "draft_model"
    page.fill("#f-max_tokens", "24")
    page.select_option("#speed", "max")
    runs_a_chain_then_eagle_gets_the_tree_back(page)
