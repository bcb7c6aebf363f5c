"""The draft model's cross-check with vLLM (engine/experiments/draft_crosscheck.py), offline: vLLM's per-step
lists read with our stop rule, and each reason a step list can differ named where it applies."""
import numpy as np

from engine.experiments.draft_crosscheck import at_our_stop, compare_steps

EOS, V = 2, 100
OUTSIDE = np.zeros(V, bool)
OUTSIDE[90:] = True                     # tokens 90..99 are outside the draft's subset S


def run(accepted, drafted=None, drafts=None, ids=None):
    drafts = drafts or [[10] * (a + 1) for a in accepted]
    return {"accepted": accepted, "drafted": drafted or [4] * len(accepted), "drafts": drafts,
            "ids": ids or list(range(3, 3 + 1 + sum(a + 1 for a in accepted)))}


def test_vllms_steps_past_max_tokens_are_read_as_our_last_round_drafts_them():
    # 1 (prefill) + 5 + 3 + 1 = 10 tokens; at max_tokens 12 our next round may draft min(4, 12 - 10 - 1) = 1
    assert at_our_stop([4, 2, 0, 3], 12, 4) == [4, 2, 0, 1]
    assert at_our_stop([4, 2, 0, 3, 2], 11, 4) == [4, 2, 0]        # no room left for a draft: a plain step
    assert at_our_stop([1, 1], 96, 4) == [1, 1]                    # far from the stop: unchanged


def test_equal_lists_are_equal_and_a_stop_difference_is_named():
    ours = run([4, 2, 0, 1], drafted=[4, 4, 4, 1])
    assert compare_steps(ours, run([4, 2, 0, 1]), OUTSIDE, 96, 4, EOS)["equal"] is True
    r = compare_steps(ours, run([4, 2, 0, 3]), OUTSIDE, 12, 4, EOS)
    assert (r["equal"], r["equal_at_stop"]) == (False, True)
    assert r["why"] == "the stop: vLLM's last step drafted 4 and accepted 3, ours 1, all that max_tokens 12 left room for"
    r = compare_steps(run([4, 2, 0]), run([4, 2, 0, 3]), OUTSIDE, 11, 4, EOS)        # vLLM's step past our last
    assert r["equal_at_stop"] and r["why"].endswith("where our last step had no room to draft")


def test_a_context_token_outside_the_subset_explains_the_step_it_is_drafted_in():
    ours = run([1, 2, 0], drafts=[[10, 11], [10, 95, 12], [10]])          # token 95: outside S
    r = compare_steps(ours, run([1, 0, 0]), OUTSIDE, 96, 4, EOS)
    assert r["step"] == 2 and "outside S" in r["why"] and "95" in r["why"]


def test_outputs_that_part_explain_the_steps_from_there_and_the_rest_is_unexplained():
    ours, theirs = run([1, 2, 0]), run([1, 1, 3])
    theirs["ids"] = ours["ids"][:4] + [77] + ours["ids"][5:]              # the target's 5th token differs
    assert "outputs part at token 5" in compare_steps(ours, theirs, OUTSIDE, 96, 4, EOS)["why"]
    r = compare_steps(run([1, 2, 0]), run([1, 1, 0]), OUTSIDE, 96, 4, EOS)
    assert r["why"].startswith("unexplained: step 2")
