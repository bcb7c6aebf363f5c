"""A token tree's scratch slots in the KV map (real Chromium, real server): a link drafting EAGLE-2 trees on the
shipped character model, stepped round by round; each tree round draws its scratch slots under the target's pool,
every slot filling in turn, then those off the accepted path freed and the path's kept."""
from __future__ import annotations

import pytest

from tests.e2e.test_playground import PROMPT, open_page, url

pytestmark = pytest.mark.browser

SLOTS = """async () => {
  const tree = document.querySelector('#kv-tree')
  const slots = [...tree.querySelectorAll('.kv-slot')]
  const running = slots.map(s => s.getAnimations().map(a => a.animationName).sort().join(' '))
  await Promise.all(slots.flatMap(s => s.getAnimations().map(a => a.finished)))
  const css = getComputedStyle(document.body)
  const color = name => { const i = document.createElement('i'); i.style.background = css.getPropertyValue(name);
                          document.body.append(i); const c = getComputedStyle(i).backgroundColor; i.remove(); return c }
  return { hidden: tree.hidden, rows: +tree.dataset.rows, kept: +tree.dataset.kept, caption: tree.querySelector('.kv-caption').textContent,
           slots: slots.map((s, i) => ({ kept: s.hasAttribute('data-kept-at'), freed: s.hasAttribute('data-freed'),
                                         animations: running[i], delays: getComputedStyle(s).animationDelay,
                                         background: getComputedStyle(s).backgroundColor })),
           free: color('--kv-free'), used: color('--kv-used') }
}"""


def test_the_kv_map_fills_a_trees_scratch_slots_then_frees_those_off_the_path(live_server, page, artifacts_dir):
    open_page(page, url(live_server, model="target-mha", method="eagle", num_speculative_tokens=3,
                        speculative_eagle_topk=3, speculative_num_draft_tokens=8, temperature=1, seed=3,
                        max_tokens=200, block_size=8, prompt=PROMPT))
    assert page.locator("#kv-tree").get_attribute("hidden") is not None
    page.keyboard.press("ArrowRight")                                      # step from idle: start, prefill
    page.wait_for_selector("#run-status[data-state='paused'][data-round='0']")
    for step in range(1, 31):
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f"#run-status[data-round='{step}']")
        if page.locator("#kv-tree").get_attribute("hidden") is None:
            break
    drawn = page.evaluate(SLOTS)
    assert not drawn["hidden"] and len(drawn["slots"]) == drawn["rows"] == 9        # the root and 8 nodes
    kept = [s for s in drawn["slots"] if s["kept"]]
    assert len(kept) == drawn["kept"] >= 1 and drawn["slots"][0]["kept"]           # the root always stays
    assert all(s["kept"] != s["freed"] for s in drawn["slots"])
    # each slot filled in turn; those off the path freed afterwards, ending free; the path's ending used
    assert all(s["animations"] == ("kv-slot-fill" if s["kept"] else "kv-slot-fill kv-slot-free") for s in drawn["slots"])
    n = drawn["rows"]
    for i, slot in enumerate(drawn["slots"]):                      # slot i fills at 0.12 i s, frees after all
        delays = [float(d.strip().removesuffix("s")) for d in slot["delays"].split(",")]
        assert delays == pytest.approx([0.12 * i] if slot["kept"] else [0.12 * i, 0.12 * n + 0.4])
    assert all(s["background"] == (drawn["used"] if s["kept"] else drawn["free"]) for s in drawn["slots"])
    assert f"{drawn['rows'] - drawn['kept']} freed" in drawn["caption"]
    page.locator(".kv-panel").screenshot(path=str(artifacts_dir / "playground-tree-kv.png"))
    assert page.recorder.errors == []
