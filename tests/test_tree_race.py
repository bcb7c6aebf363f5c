"""A chain against a token tree in the Race and the Shoot-out (engine/experiments/race.py, shootout.py), on the
shipped character model and its EAGLE head: the race's sides differ in speculative_eagle_topk alone, a URL sets
them, and the Shoot-out lists the tree beside the chains. Greedy, so every side writes plain decoding's text."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app
from engine.experiments.race import TREE_BUDGET, race, race_choices, tree_method
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from tests.test_page import Form
from tests.test_teach_runs import FORM

PROMPT = "class Stack:\n    def "


@pytest.fixture(scope="module")
def client(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        yield c


@pytest.fixture(scope="module")
def shipped():
    return InferenceEngine(ModelRegistry.from_dir(MODELS_DIR, fetched=False), max_sessions=2)


def test_a_race_of_chain_against_tree_drafts_with_a_tree_drafter_and_quotes_tokens_per_forward(shipped):
    target = shipped.registry.get("target-mha")
    assert tree_method(shipped.registry, target) == "eagle"          # target-mha ships an EAGLE head
    assert ("4", "top-4 tree") in race_choices(shipped.registry, target)["speculative_eagle_topk"]
    # the page's method drafts no tree: the race takes the target's EAGLE head, and a budget of TREE_BUDGET nodes
    r = race(shipped, PROMPT, {"model": "target-mha", "method": "draft_model", "num_speculative_tokens": 3,
                               "max_tokens": 40}, "speculative_eagle_topk", ("1", "4"), repeats=3)
    a, b = r["lanes"]
    assert r["settings"]["method"] == "eagle" and r["settings"]["speculative_num_draft_tokens"] == TREE_BUDGET
    assert [a["label"], b["label"]] == ["chain (γ = 3)", f"top-4 tree ({TREE_BUDGET} nodes, depth 3)"]
    assert (a["run"]["settings"]["speculative_eagle_topk"], b["run"]["settings"]["speculative_eagle_topk"]) == (1, 4)
    assert r["same_text"]                                            # greedy: chain, tree and plain agree
    mal = [lane["figures"]["mean_acceptance_length"] for lane in (a, b)]
    assert all(m > 1 for m in mal)
    assert f"tokens per target forward {mal[0]:.2f} → {mal[1]:.2f}" in r["verdict"]["text"]
    assert all(m.pool.num_used_blocks == 0 for m in shipped.managers.values())


def test_a_tree_race_keeps_the_pages_budget_and_refuses_a_budget_below_the_depth(shipped):
    s = {"model": "target-mha", "method": "ngram", "num_speculative_tokens": 2, "speculative_num_draft_tokens": 5,
         "max_tokens": 12}
    r = race(shipped, PROMPT, s, "speculative_eagle_topk", ("2", "1"), repeats=3)
    assert r["settings"]["method"] == "ngram" and [lane["label"] for lane in r["lanes"]] == [
        "top-2 tree (5 nodes, depth 2)", "chain (γ = 2)"]
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        race(shipped, PROMPT, {**s, "num_speculative_tokens": 6}, "speculative_eagle_topk", ("1", "4"))


def test_a_race_of_budgets_draws_trees_at_the_pages_top_k_or_a_tree_where_it_sets_a_chain(shipped):
    s = {"model": "target-mha", "method": "eagle", "num_speculative_tokens": 3, "max_tokens": 24}
    r = race(shipped, PROMPT, s, "speculative_num_draft_tokens", ("4", "12"), repeats=3)
    assert [lane["label"] for lane in r["lanes"]] == ["top-4 tree (4 nodes, depth 3)", "top-4 tree (12 nodes, depth 3)"]
    assert r["same_text"] and "tokens per target forward" in r["verdict"]["text"]
    r = race(shipped, PROMPT, {**s, "speculative_eagle_topk": 2}, "speculative_num_draft_tokens", ("3", "6"), repeats=3)
    assert [lane["label"] for lane in r["lanes"]] == ["top-2 tree (3 nodes, depth 3)", "top-2 tree (6 nodes, depth 3)"]
    # the largest tree the budget allows holds more nodes than the smallest, round by round
    drafted = [lane["run"]["summary"]["num_draft_tokens"] / lane["run"]["summary"]["num_drafts"] for lane in r["lanes"]]
    assert drafted[0] <= 3 < drafted[1] <= 6
    with pytest.raises(ValueError, match=r"speculative_num_draft_tokens: must be in \[num_speculative_tokens \(3\)"):
        race(shipped, PROMPT, s, "speculative_num_draft_tokens", ("2", "8"))


def test_a_url_sets_a_chain_against_a_tree_in_the_race(client):
    form = Form(client.get("/?model=target-mha&method=eagle&view=race&race=speculative_eagle_topk"
                           "&race_a=1&race_b=4").text)
    assert form.by_id("teach")["data-open"] == "race"
    assert (form.values["race"], form.values["race_a"], form.values["race_b"]) == ("speculative_eagle_topk", "1", "4")
    html = client.get("/?model=target-mha&view=race&race=speculative_eagle_topk&race_a=1&race_b=9").text
    assert "ignored race_b=&#39;9&#39; from the URL: for race=speculative_eagle_topk, one of 1, 2, 3, 4, 8" in html


def test_the_race_view_runs_a_chain_against_a_tree(client):
    form = {**FORM, "model": "target-mha", "method": "eagle", "num_speculative_tokens": "3",
            "race": "speculative_eagle_topk", "race_a": "1", "race_b": "4"}
    html = client.post("/teach/race", data=form).text
    assert re.findall(r"<h3>(.*?)</h3>", html) == ["chain (γ = 3)", f"top-4 tree ({TREE_BUDGET} nodes, depth 3)"]
    mal = re.findall(r'data-figure="mean_acceptance_length">([\d.]+)<', html)
    assert len(mal) == 2 and all(float(m) > 1 for m in mal)
    assert f"tokens per target forward {mal[0]} → {mal[1]}" in html and "exactly the same text" in html


def test_the_shootout_lists_a_tree_beside_the_chains(client):
    # the page sets a tree: the chains stay chains, the tree row takes the page's shape
    form = {**FORM, "model": "target-mha", "method": "eagle", "num_speculative_tokens": "3",
            "speculative_eagle_topk": "3", "speculative_num_draft_tokens": "7", "max_tokens": "24"}
    html = client.post("/teach/shootout", data=form).text
    rows = dict(re.findall(r'<tr data-method="(\w+)">(.*?)</tr>', html, re.S))
    assert list(rows) == ["none", "ngram", "draft_model", "medusa", "eagle", "eagle_tree"]
    assert all(re.search(r'data-figure="identical">yes<', r) for r in rows.values())
    assert '<th scope="row">EAGLE tree (top-3, 7 nodes)</th>' in rows["eagle_tree"]
    chain, tree = (float(re.search(r'data-figure="mal">([\d.]+)<', rows[m]).group(1)) for m in ("eagle", "eagle_tree"))
    assert chain >= 1 and tree >= 1
    # its verification rows are the tree's nodes and the root (fewer only where the end of the run cut a tree)
    rows_verified = float(re.search(r'data-figure="verify_ratio">[\d.]+ <span class="hint">\(([\d.]+)\)', rows["eagle_tree"]).group(1))
    assert 4 < rows_verified <= 8
