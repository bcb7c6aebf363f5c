"""vLLM's steps read from its stream (engine/external/vllm_rounds.py), offline: chunks of token ids against the
per-step lists vLLM sends (the live checks are tests/e2e/vllm_live/test_cross_checks.py)."""
import random

from engine.external.vllm_rounds import VllmSteps, accepted_per_position, reconcile, stream_figures


def read(method, chunks, gamma=3, rule=None):
    steps = VllmSteps(method, gamma, rule)
    steps.prompt([1, 2, 3])
    return steps, [steps.take(ids) for ids in chunks]


def test_the_first_step_is_the_prefill_and_later_ones_verify_gamma_drafts():
    _, taken = read("eagle", [[5], [6, 7], [8], [9, 10, 11, 12]])
    assert [(s.drafted, s.accepted) for s in taken] == [(0, 0), (3, 1), (3, 0), (3, 3)]
    assert taken[1].statuses == ["accepted", "resampled"] and taken[3].statuses[-1] == "bonus"
    assert taken[0].statuses == ["target"]


def test_a_chunk_longer_than_a_step_is_merged_and_not_counted():
    _, taken = read("eagle", [[5], [6, 7, 8, 9, 10]])
    assert taken[1].merged and taken[1].statuses == ["target"] * 5


def test_ngram_steps_without_a_draft_stream_one_token_and_are_not_in_vllms_lists():
    steps, _ = read("ngram", [[5], [6], [7, 8]], gamma=4, rule=lambda ids: 0 if len(ids) < 5 else 4)
    r = reconcile(steps.steps, {"speculative_decoding": {"per_step_drafted": [4], "per_step_accepted": [1]}}, 4)
    assert r["agree"] is True and r["steps_without_draft"] == 2 and r["stream"]["per_step_accepted"] == [1]


def test_a_last_step_cut_by_the_stop_takes_vllms_count_and_says_so():
    steps, _ = read("eagle", [[5], [6, 7], [8, 2]])
    lists = {"per_step_drafted": [3, 3], "per_step_accepted": [1, 3]}
    r = reconcile(steps.steps, {"speculative_decoding": lists}, 3)
    assert r["agree"] is True and r["reconciled"]["per_step_accepted"] == [1, 3]
    assert "cut by the stop" in r["notes"][0]
    assert r["reconciled"]["mean_acceptance_length"] == 1 + 4 / 2


def test_steps_that_differ_are_named():
    steps, _ = read("eagle", [[5], [6, 7], [8]])
    r = reconcile(steps.steps, {"speculative_decoding": {"per_step_drafted": [3, 3], "per_step_accepted": [0, 0]}}, 3)
    assert r["agree"] is False and "from step 1" in r["notes"][-1]


def test_accepted_per_position_counts_each_step_at_its_accepted_positions():
    assert accepted_per_position([0, 2, 3, 1], 3) == [3, 2, 1]


def test_the_figures_kept_as_steps_come_are_those_of_all_the_steps():
    """The gauges' figures, kept step by step, equal the reconciliation's from the whole lists (steps without a
    draft and merged chunks left out), at every step."""
    rng = random.Random(0)
    steps = VllmSteps("ngram", 4, lambda ids: rng.choice([0, 2, 4]))
    steps.prompt([1, 2, 3])
    for _ in range(200):
        steps.take([7] * rng.randint(1, 6))
        whole = reconcile(steps.steps, None, 4)["stream"]
        kept = stream_figures(steps)
        assert {k: kept[k] for k in whole if k in kept} == {k: v for k, v in whole.items() if k in kept}
    assert kept["num_drafts"] > 50 and kept["accepted_per_position"][3] > 0
