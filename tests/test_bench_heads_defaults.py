"""`bench heads` records the demo's EAGLE setting per thread count (cli/bench/heads.py): the fastest,
but the one in use stays while the fastest beats it by no more than a run's noise."""
from cli.bench.heads import TIE, best_row, current_defaults, record_defaults


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
