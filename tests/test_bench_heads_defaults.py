"""`bench heads` records the demo's EAGLE setting per thread count (engine/experiments/tree_shapes.py): the fastest,
chain or tree, but the one in use stays while the fastest beats it by no more than a run's noise; the trees are
set beside the best chain of their method."""
import pytest

from cli.bench.smollm2 import config
from engine.experiments.tree_shapes import (TIE, TREE_SHAPES, best_row, current_defaults, drafting, is_tree,
                                            record_defaults, tree_config, tree_configs, tree_goals, tree_rows,
                                            verified_nodes)
from engine.model.threads import set_threads, threads
from engine.serving.settings import GenerationSettings


def row(gamma, confidence, measured, identical=True, method="eagle"):
    return {"method": method, "gamma": gamma, "confidence": confidence, "measured": measured,
            "identical": identical, "config": f"eagle γ≤{gamma}, q≥{confidence}"}


def test_the_setting_in_use_stays_unless_another_beats_it_by_more_than_the_noise(tmp_path):
    rows = [row(3, 0.0, 1.36), row(5, 0.5, 1.4604), row(7, 0.5, 1.4609), row(9, 0.5, 1.60, identical=False),
            row(1, 0.0, 1.70, method="medusa")]
    assert best_row(rows)["gamma"] == 7                             # the fastest with identical output
    record_defaults(tmp_path, "today", {1: row(5, 0.5, 1.45)})
    current = current_defaults(tmp_path)
    assert current[1]["num_speculative_tokens"] == 5
    assert best_row(rows, current[1])["gamma"] == 5                 # 1.4609 is within TIE of 1.4604
    faster = rows + [row(4, 0.5, 1.4604 * (1 + 2 * TIE))]
    assert best_row(faster, current[1])["gamma"] == 4               # a real gain replaces it
    assert best_row(rows, {"num_speculative_tokens": 2, "draft_confidence_threshold": 0.5})["gamma"] == 7


def measured_row(config, settings, L, measured, identical=True, **more):
    method = settings["method"]
    return {"config": config, "method": method, **drafting(settings), "mean_acceptance_length": L, "measured": measured,
            "identical": identical, "v": 1.5, **more}


def test_every_tree_measured_is_a_valid_setting_and_verifies_its_budget():
    for label, settings in tree_configs(["eagle", "medusa"]) + tree_configs(["eagle", "medusa"], quick=True):
        parsed = GenerationSettings.parse(settings)
        assert parsed.tree_error() is None and parsed.drafts_tree, label
        assert verified_nodes(settings) == parsed.num_draft_tokens <= 16
        assert drafting(settings)["budget"] == parsed.num_draft_tokens and is_tree(drafting(settings))
    label, chain = config("eagle", 3)
    assert verified_nodes(chain) == 3 and not is_tree(drafting(chain))
    assert tree_configs(["medusa"]) == [tree_config("medusa", *s) for s in TREE_SHAPES["medusa"]]


def test_a_tree_is_set_beside_the_fastest_chain_of_its_method_that_wrote_the_plain_output():
    rows = [measured_row(*config("eagle", 2), 1.7, 0.95), measured_row(*config("eagle", 3), 1.9, 1.00),
            measured_row(*config("eagle", 4), 2.0, 1.20, identical=False),        # faster, but not plain's output
            measured_row(*config("medusa", 3), 1.3, 0.80),
            measured_row(*tree_config("eagle", 5, 4, 8), 2.47, 1.05, curve_ratio=1.9, h100_projected=2.1),
            measured_row(*tree_config("eagle", 6, 4, 16), 2.66, 0.98),
            measured_row(*tree_config("medusa", 3, 2, 8), 1.5, 0.84)]
    trees = {t["config"]: t for t in tree_rows(rows)}
    assert len(trees) == 3
    small = trees[tree_config("eagle", 5, 4, 8)[0]]
    assert (small["chain"], small["depth"], small["topk"], small["budget"], small["verify_rows"]) == (
        "eagle γ=3", 5, 4, 8, 9)
    assert small["vs_chain"] == pytest.approx(1.05) and small["acceptance_vs_chain"] == pytest.approx(1.3)
    assert (small["curve_ratio"], small["h100_projected"]) == (1.9, 2.1)
    assert trees[tree_config("medusa", 3, 2, 8)[0]]["vs_chain"] == pytest.approx(0.84 / 0.80)
    goals = {what: (value, bound) for what, value, _, bound, _ in tree_goals(list(trees.values()))}
    assert goals == {"EAGLE tree of <= 8 nodes: mean acceptance length / the best chain's": (pytest.approx(1.3), 1.2),
                     "EAGLE tree at its fastest shape / the best chain (decode)": (pytest.approx(1.05), 1.0),
                     "EAGLE tree at its fastest shape / plain decoding (decode)": (1.05, 1.0)}
    assert tree_goals(tree_rows(rows[:4])) == []                                  # no tree, no tree goals


def test_a_tree_that_wins_becomes_the_demos_drafting_and_a_request_gets_its_whole_shape(tmp_path):
    from types import SimpleNamespace

    from engine.serving.request_fit import model_defaults
    from engine.spec_decode.heads import demo_settings
    chain, tree = measured_row(*config("eagle", 3), 1.9, 1.00), measured_row(*tree_config("eagle", 5, 4, 8), 2.5, 1.04)
    assert best_row([chain, tree]) is tree
    assert best_row([chain, tree], {"num_speculative_tokens": 3, "draft_confidence_threshold": 0.0}) is tree
    close = {**tree, "measured": 1.00 * (1 + TIE / 2)}
    assert best_row([chain, close], {"num_speculative_tokens": 3, "draft_confidence_threshold": 0.0}) is chain
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    record_defaults(folder, "today", {1: chain, 2: tree})
    assert "speculative_eagle_topk" not in current_defaults(folder)[1]
    assert best_row([chain, close], current_defaults(folder)[2]) is close          # the tree in use stays
    assert demo_settings("smollm2-135m", 1, tmp_path) == {
        "num_speculative_tokens": 3, "draft_confidence_threshold": 0.0, "threads": 1}
    assert demo_settings("smollm2-135m", 2, tmp_path) == {
        "num_speculative_tokens": 5, "draft_confidence_threshold": 0.0, "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8, "threads": 2}
    lm = SimpleNamespace(name="smollm2-135m", meta={"heads": ["eagle"]})
    registry = SimpleNamespace(heads_dir=tmp_path, draft_for=lambda target: None)
    before = threads()
    try:
        set_threads(2)
        assert model_defaults(registry, lm) == {"method": "eagle", "num_speculative_tokens": 5,
                                                "draft_confidence_threshold": 0.0, "speculative_eagle_topk": 4,
                                                "speculative_num_draft_tokens": 8}
    finally:
        set_threads(before)


def test_the_draft_models_targets_are_judged_on_its_gamma_4_row():
    import copy
    import json
    from pathlib import Path

    from cli.bench.heads import tables
    out = json.loads((Path(__file__).parents[1] / "models/heads/smollm2-135m/bench.json").read_text())
    row = next(x for x in out["sets"]["open questions"]["rows"] if x["config"] == "draft_model γ=4")
    for p1, met in ((0.4275, "**no**"), (0.4512, "yes")):
        row["acceptance_per_position"][0] = p1
        text = "\n".join(tables(copy.deepcopy(out)))
        assert (f"| Draft model acceptance at position 1, γ = 4, open questions | {p1:.3f} (draft_model γ=4) "
                f"| >= 0.45 | {met} |") in text
    assert f"| c of the draft model, γ = 4, open questions | {row['c']:.3f} (draft_model γ=4) | <= 0.1 |" in text
