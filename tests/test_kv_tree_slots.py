"""A token tree's scratch slots in the target's paged cache, as the kv event carries them (engine/serving/
session_figures.py's `tree_scratch`) and the KV map draws them (app/views/kv_map.py's `kv_tree_html`), from real
EAGLE-2 rounds on the shipped character model and its head: every row of the verification forward at the
position, block and offset the cache gave it, the accepted path's rows kept in order, the others freed, and the
scratch blocks that emptied named."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app
from app.protocol import Batch, RenderContext
from app.views.frame import Frame
from app.views.kv_map import KvMap
from app.views.replay import rounds_of
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

PROMPT = "class Stack:\n    def "
TREE = {"model": "target-mha", "method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 3,
        "speculative_num_draft_tokens": 8, "max_tokens": 60, "temperature": 1, "seed": 3}


@pytest.fixture(scope="module")
def shipped():
    return InferenceEngine(ModelRegistry.from_dir(MODELS_DIR, fetched=False), max_sessions=1)


def tree_rounds(events) -> list[tuple]:
    """(round event, kv event) of each round that verified a tree."""
    out, last_round = [], None
    for e in events:
        if e.type == "round":
            last_round = e
        elif e.type == "kv" and e.tree is not None:
            out.append((last_round, e))
    return out


@pytest.mark.parametrize("block_size", [8, 16])
def test_a_tree_rounds_kv_event_maps_every_scratch_row_and_keeps_the_path(shipped, block_size):
    events = list(GenerationSession(shipped, PROMPT, {**TREE, "block_size": block_size}).events())
    rounds = tree_rounds(events)
    assert len(rounds) > 10
    freed_any = False
    for rnd, kv in rounds:
        t = kv.tree
        rows = t["rows"]
        target = next(p for p in kv.pools if p["role"] == "target")
        table = target["block_table"]                    # after the round: the path kept, the scratch freed
        assert t["pool"] == target["name"] and t["block_size"] == block_size
        assert len(rows) == rnd.verify_tokens == rnd.num_draft_tokens + 1       # the root and every node
        assert [r["position"] for r in rows] == list(range(t["start"], t["start"] + len(rows)))
        assert [r["node"] for r in rows] == [None, *range(len(rows) - 1)]
        assert all(r["offset"] == r["position"] % block_size for r in rows)
        # kept: the root and the accepted nodes (the round's verdicts), moved in order to the first scratch slots
        kept = [r for r in rows if r["kept_at"] is not None]
        assert [r["node"] for r in kept] == [None, *(i for i, s in enumerate(rnd.node_status) if s == "accepted")]
        assert [r["kept_at"] for r in kept] == list(range(t["start"], t["start"] + len(kept)))
        assert len(kept) == rnd.num_accepted + 1
        # the cache now holds the kept positions in the blocks named; a scratch block the table no longer holds
        # was freed in this round, and no other
        assert all(table[r["position"] // block_size] == r["block_id"] for r in rows
                   if r["position"] < t["start"] + len(kept))
        assert t["freed_blocks"] == sorted({r["block_id"] for r in rows} - set(table))
        assert all({"kind": "free", "block_id": b, "pool": t["pool"]} in kv.events for b in t["freed_blocks"])
        freed_any |= bool(t["freed_blocks"])
    assert freed_any                                     # some tree crossed into a block of its own
    chains = [e for e in events if e.type == "kv" and e.tree is None]
    assert len(chains) >= 1                              # the prefill's: no tree
    assert all(m.pool.num_used_blocks == 0 for m in shipped.managers.values())


def test_the_kv_map_draws_the_scratch_slots_and_hides_them_on_a_chains_round(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        engine = c.app.state.playground.engine
        events = list(GenerationSession(engine, PROMPT, {**TREE, "block_size": 8}).events())
        view = c.app.state.playground.view("html")
        view.form_prompt = PROMPT
        drawn = []
        for chunk in rounds_of(events):
            html = "".join(view.render([Batch(1, chunk)], RenderContext(run_id=1, state="running")))
            kv = next((e for e in chunk if e.type == "kv"), None)
            drawn.append((kv, re.search(r'<div id="kv-tree".*?</div></div>|<div id="kv-tree"[^>]*hidden></div>',
                                        html, re.S)))
    seen = 0
    for kv, element in drawn:
        if kv is None or kv.tree is None:
            continue
        seen += 1
        t, html = kv.tree, element.group(0)
        slots = re.findall(r'<i class="kv-slot" data-row="(\d+)" data-position="(\d+)" data-block="(\d+)"'
                           r'( data-kept-at="\d+"| data-freed)', html)
        assert [(int(a), int(b), int(c)) for a, b, c, _ in slots] == [
            (r["row"], r["position"], r["block_id"]) for r in t["rows"]]
        assert [m != " data-freed" for *_, m in slots] == [r["kept_at"] is not None for r in t["rows"]]
        kept = sum(r["kept_at"] is not None for r in t["rows"])
        assert f'data-kept="{kept}"' in html and f"{len(t['rows']) - kept} freed" in html
        if t["freed_blocks"]:
            assert f"and with them block {t['freed_blocks'][0]}" in html
    assert seen > 10
    assert drawn[0][1] is None                            # the prefill's round drew no tree: nothing sent then
    # after a tree's round, a round without one (a chain's) hides the element, once
    chain = [e for e in GenerationSession(engine, PROMPT, {**TREE, "speculative_eagle_topk": 1}).events()
             if e.type == "kv"]
    last_tree = next(kv for kv, _ in reversed(drawn) if kv is not None and kv.tree is not None)
    kv_map, frames = KvMap(), [Frame(kv_events=[e]) for e in (last_tree, chain[1], chain[2])]
    for frame in frames:
        kv_map.render(frame, lambda key: None, False)
    assert 'data-kept=' in frames[0].replace["kv-tree"]
    assert frames[1].replace["kv-tree"] == '<div id="kv-tree" hx-swap-oob="true" class="kv-tree" hidden></div>'
    assert "kv-tree" not in frames[2].replace
