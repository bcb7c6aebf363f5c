"""The draft lane of a token tree (app/views/draft_lane.py, the `lane` macro), from real sessions on the shipped
character model and its EAGLE head: each node's verdict as the round event gives it, the nodes nested under their
parents, the accepted path ending in the resampled or bonus token, the caption's depth, top-k and budget; and the
token events that name their node (engine/serving/session_figures.py)."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest

from app.views.draft_lane import drafted, round_ended, token_verdict
from app.views.templating import macros
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

TREE = {"model": "target-mha", "method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 3,
        "speculative_num_draft_tokens": 8, "max_tokens": 60}
PROMPT = "class Stack:\n    def "


@pytest.fixture(scope="module")
def shipped():
    return InferenceEngine(ModelRegistry.from_dir(MODELS_DIR, fetched=False), max_sessions=1)


def lanes(engine, settings) -> list[tuple[dict, list]]:
    """Each drafting round's lane as the page builds it, with the round's events."""
    out, lane, events = [], None, []
    for e in GenerationSession(engine, PROMPT, settings).events():
        if e.type == "draft":
            lane, events = drafted(e), [e]
        elif e.type == "token":
            lane = token_verdict(lane, e, False)
            events.append(e)
        elif e.type == "round" and lane is not None and lane["round"] == e.round and lane["drafts"]:
            round_ended(lane, e, False, settings["method"])
            out.append((lane, events + [e]))
    return out


class Chips(HTMLParser):
    """The lane's chips: each one's attributes and the data-node of the chip its branch hangs from."""

    def __init__(self, html: str):
        super().__init__()
        self.chips: list[dict] = []
        self.shape: dict = {}
        self._stack: list[tuple[str, dict | None]] = []    # (tag, the branch's chip) per open element
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "lane-shape" in a.get("class", ""):
            self.shape = a
        classes = a.get("class", "").split()
        if "chip" in classes:
            parent = next((chip for t, chip in reversed(self._stack[:-1]) if chip is not None), None)
            a["parent_chip"] = parent
            self.chips.append(a)
            if self._stack and self._stack[-1][1] is None and self._stack[-1][0] == "branch":
                self._stack[-1] = ("branch", a)
        self._stack.append(("branch" if "tree-branch" in classes else tag, None))

    def handle_endtag(self, tag):
        self._stack.pop()


def test_a_tree_lane_draws_every_node_under_its_parent_with_its_verdict(shipped):
    seen_rejected = False
    rounds = lanes(shipped, {**TREE, "temperature": 1, "seed": 3})
    assert rounds
    for lane, events in rounds:
        draft, done = events[0], events[-1]
        assert draft.tree == {"topk": 3, "depth": max(depth(draft.tokens, i) for i in range(len(draft.tokens))),
                              "num_draft_tokens": 8}
        assert len(done.node_status) == len(draft.tokens)
        chips = Chips(str(macros().lane(lane)))
        assert chips.shape["data-topk"] == "3" and chips.shape["data-budget"] == "8"
        assert chips.shape["data-tree-depth"] == str(draft.tree["depth"])
        nodes = {int(c["data-node"]): c for c in chips.chips if "data-node" in c}
        assert sorted(nodes) == list(range(len(draft.tokens)))
        for i, (token, status) in enumerate(zip(draft.tokens, done.node_status)):
            chip = nodes[i]
            assert chip["data-token-status"] == {"unreached": "unverified"}.get(status, status)
            parent = chip["parent_chip"]
            assert (parent is None) == (token["parent"] == -1)
            if parent is not None:
                assert parent["data-node"] == str(token["parent"])
            assert chip["data-depth"] == str(depth(draft.tokens, i))
            assert f"q={token['q']:.3f}" in chip["title"]
            seen_rejected |= status == "rejected"
        # the accepted path: root to its end, one node a depth; the round's last token hangs from its end
        path = [i for i, s in enumerate(done.node_status) if s == "accepted"]
        assert [draft.tokens[i]["parent"] for i in path] == [-1, *path][:len(path)]
        last = [c for c in chips.chips if "data-node" not in c]
        assert len(last) == 1 and last[0]["data-token-status"] in ("resampled", "bonus")
        assert (last[0]["parent_chip"] or {}).get("data-node") == (str(path[-1]) if path else None)
        assert last[0]["data-pos"] == str(len(path) + 1)
    assert seen_rejected, "no round rejected a node: the test saw no rejected branch"


def depth(tokens, i) -> int:
    return 1 if tokens[i]["parent"] == -1 else depth(tokens, tokens[i]["parent"]) + 1


def test_a_tree_rounds_token_events_name_their_nodes(shipped):
    """Each draft token's verdict names its node: the token there, with the verdict the round gives that node; the
    rejected ones are the children of the path's end."""
    for greedy in (True, False):
        for lane, events in lanes(shipped, {**TREE, "temperature": 0 if greedy else 1, "seed": 5}):
            draft, done = events[0], events[-1]
            path = [i for i, s in enumerate(done.node_status) if s == "accepted"]
            for e in events[1:-1]:
                if e.status in ("accepted", "rejected"):
                    assert draft.tokens[e.node]["id"] == e.id and done.node_status[e.node] == e.status
                    if e.status == "rejected":
                        assert draft.tokens[e.node]["parent"] == (path[-1] if path else -1)
                else:
                    assert e.node is None and e.status in ("resampled", "bonus")


def test_a_chain_lane_stays_a_row_of_chips(shipped):
    """topk 1 drafts a chain: its lane is today's row of chips, no tree in it."""
    for lane, events in lanes(shipped, {**TREE, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": None,
                                        "temperature": 1}):
        assert events[0].tree is None and events[-1].node_status == []
        html = str(macros().lane(lane))
        assert "lane-tree" not in html and "tree-branch" not in html
        assert html.count('class="chip') == len(lane["drafts"]) + 1


def test_the_inspector_shows_a_tree_tokens_siblings_tries(models_dir):
    """On a tree token the inspector lists the children tried at its parent, in order, each with p' (the residual
    when it was tried), q, min(1, p'/q), r, its verdict and the residual its rejection left."""
    from fastapi.testclient import TestClient

    from app.config import AppConfig
    from app.main import create_app
    from app.protocol import Batch, RenderContext
    from app.views.replay import rounds_of

    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        engine = c.app.state.playground.engine
        events = list(GenerationSession(engine, PROMPT, {**TREE, "temperature": 1, "seed": 3}).events())
        view = c.app.state.playground.view("html")
        view.form_prompt = PROMPT
        for chunk in rounds_of(events):
            view.render([Batch(1, chunk)], RenderContext(run_id=1, state="running"))
        # a token accepted after a sibling was refused: its row of tries holds both
        token = next(e for e in events if e.type == "token" and e.status == "accepted" and len(e.siblings) > 1)
        html = c.get("/teach/inspect", params={"recording": view.recording.key, "round": token.round,
                                               "position": token.position, "status": "accepted"}).text
        rows = html.split("<tr data-node=")[1:]
        assert len(rows) == len(token.siblings)
        for row, tried in zip(rows, token.siblings):
            assert row.startswith(f'"{tried["node"]}" data-accepted="{int(tried["accepted"])}"')
            assert f"<td>{tried['p']:.3f}</td><td>{tried['q']:.3f}</td><td>{tried['accept_prob']:.3f}</td>" in row
            assert f"<td>{tried['r']:.3f}</td>" in row
            assert ("accepted" if tried["accepted"] else "rejected") in row
            assert (tried["node"] == token.node) == ('class="inspected-try"' in row)
        refused = [t for t in token.siblings if not t["accepted"]]
        assert refused and all(t["residual_top"] and abs(sum(x[2] for x in t["residual_top"])) <= 1 + 1e-9
                               for t in refused)
        assert f"<code>{refused[0]['residual_top'][0][1]}</code>" in rows[token.siblings.index(refused[0])]
        # children of the path's end all rejected at one position: each one's chip opens its own
        both = next(e for e in events if e.type == "token" and e.status == "rejected"
                    and sum(not t["accepted"] for t in e.siblings) > 1)
        for tried in both.siblings:
            html = c.get("/teach/inspect", params={"recording": view.recording.key, "round": both.round,
                                                   "position": both.position, "status": "rejected",
                                                   "node": tried["node"]}).text
            assert f'<tr data-node="{tried["node"]}" data-accepted="0" class="inspected-try">' in html
            assert f'data-figure="r">{tried["r"]:.3f}<' in html
