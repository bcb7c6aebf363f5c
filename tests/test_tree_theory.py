"""The Theory view's token tree (engine/experiments/theory.py's `tree_against_chain`, GET /teach/theory.json): a tree
run's measured tokens per target forward beside Leviathan's E for a chain at the α and depth measured in its rounds,
from a real EAGLE-2 run on the shipped character model and its head, recorded as the page records it."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app
from engine.experiments.theory import RoundPoint, expected_tokens_per_round, tree_against_chain
from engine.serving.session import GenerationSession
from teach_views import show_run

PROMPT = "class Stack:\n    def "
TREE = {"model": "target-mha", "method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 3,
        "speculative_num_draft_tokens": 8, "max_tokens": 80}


@pytest.fixture(scope="module")
def client(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        yield c


def test_a_chain_run_has_no_tree_figures_and_a_tree_round_counts_its_first_tries():
    chain = [RoundPoint(1.0, 0.5, 3, 3, 2), RoundPoint(1.0, 0.5, 1, 0, 0)]
    assert tree_against_chain(chain) is None
    # two tree rounds of depth 3 and 2: first children accepted at 3 of 5 positions tried
    rounds = [RoundPoint(1.0, 0.5, 3, 8, 2, 3, (True, False, True)), RoundPoint(1.0, 0.5, 2, 6, 1, 2, (False, True)),
              *chain]
    t = tree_against_chain(rounds)
    assert t["rounds"] == 2 and t["mean_acceptance_length"] == 1 + 3 / 2 and t["alpha"] == 3 / 5
    e = (expected_tokens_per_round(0.6, 3) + expected_tokens_per_round(0.6, 2)) / 2
    assert t["chain_e"] == pytest.approx(e) and t["gain"] == pytest.approx(2.5 / e) and t["depth"] == 2.5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_theory_sets_a_tree_runs_tokens_per_forward_beside_a_chains_e(client, temperature):
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = list(GenerationSession(client.app.state.playground.engine, PROMPT,
                                    {**TREE, "temperature": temperature, "seed": 3}).events())
    show_run(view, events)
    d = client.get("/teach/theory.json", params={"recording": view.recording.key}).json()
    t = d["tree"]
    # counted apart from the route: the rounds whose draft event carries a tree, and their tokens' first tries
    trees, firsts, tree_round = [], [], None
    for e in events:
        if e.type == "draft":
            tree_round = e.tree
        elif e.type == "token" and tree_round is not None and e.siblings and e.status != "rejected":
            firsts.append(e.siblings[0]["accepted"])
        elif e.type == "round":
            if tree_round is not None:
                trees.append((e.num_accepted, tree_round["depth"]))
            tree_round = None
    assert t["rounds"] == len(trees) > 10
    assert t["mean_acceptance_length"] == pytest.approx(1 + sum(a for a, _ in trees) / len(trees))
    assert t["alpha"] == pytest.approx(sum(firsts) / len(firsts)) and 0 < t["alpha"] < 1
    e = sum(expected_tokens_per_round(t["alpha"], depth) for _, depth in trees) / len(trees)
    assert t["chain_e"] == pytest.approx(e) and t["gain"] == pytest.approx(t["mean_acceptance_length"] / e)
    html = client.get("/?view=theory").text
    assert '<p id="theory-tree" class="theory-tree" hidden>' in html and 'data-figure="chain_e"' in html
