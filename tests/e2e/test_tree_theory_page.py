"""The Theory view of a run drafting token trees (real Chromium, real server): once the run is done, the line that sets
the tree's measured tokens per target forward beside a chain's E shows the server's figures
(GET /teach/theory.json's `tree`); a chain's run hides it."""
from __future__ import annotations

import pytest

from tests.e2e.test_playground import PROMPT, open_page, url, wait_state, wait_until

pytestmark = pytest.mark.browser

TREE = dict(model="target-mha", method="eagle", num_speculative_tokens=3, speculative_eagle_topk=3,
            speculative_num_draft_tokens=8, max_tokens=80, speed="max", prompt=PROMPT, view="theory")
FIGURES = "Object.fromEntries([...document.querySelectorAll('#theory-tree [data-figure]')].map(e => [e.dataset.figure, e.textContent]))"


def test_the_theory_view_sets_a_trees_tokens_per_forward_beside_a_chains_e(live_server, page, artifacts_dir):
    open_page(page, url(live_server, **TREE))
    assert page.get_attribute("#theory-tree", "hidden") is not None          # nothing run yet
    page.click("#btn-toggle")
    wait_state(page, "done")
    wait_until(page, "document.querySelector('#theory-figures').dataset.rounds === "
                     "document.querySelector('#run-status').dataset.round")
    wait_until(page, "!document.querySelector('#theory-tree').hidden")
    key = page.get_attribute("#stream", "data-recording")
    tree = page.evaluate(f"fetch('/teach/theory.json?recording={key}').then(r => r.json())")["tree"]
    shown = page.evaluate(FIGURES)
    assert shown == {"tree_mal": f"{tree['mean_acceptance_length']:.2f}", "chain_e": f"{tree['chain_e']:.2f}",
                     "tree_alpha": f"{tree['alpha']:.2f}", "tree_depth": f"{tree['depth']:.1f}",
                     "tree_gain": f"{tree['gain']:.2f}×"}
    page.locator("#view-theory").screenshot(path=str(artifacts_dir / "teach-theory-tree.png"))
    # a chain's run: the line is hidden again
    open_page(page, url(live_server, **{**TREE, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": ""}))
    page.click("#btn-toggle")
    wait_state(page, "done")
    wait_until(page, "document.querySelector('#theory-figures').dataset.rounds === "
                     "document.querySelector('#run-status').dataset.round")
    assert page.get_attribute("#theory-tree", "hidden") is not None
    assert page.recorder.errors == []
