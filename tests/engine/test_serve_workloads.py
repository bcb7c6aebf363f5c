"""`bench serve --workload` (engine/experiments/serve_workloads.py): what each client asks, run after run, and what
a run of many clients measured (engine/experiments/serve_figures.py)."""
import pytest

from engine.experiments.serve_figures import figures, merge, over_best_fixed
from engine.experiments.serve_workloads import (REVISE, WORKLOADS, Agentic, Workshop, make_workload, revision_prompt,
                                                workshop_prompt)
from engine.experiments.workshop import QUESTIONS


def test_a_workshop_asks_every_question_in_the_same_words_again_and_in_other_words():
    n = len(QUESTIONS)
    asked = [workshop_prompt(r) for r in range(3 * n)]
    words, paraphrases = [q[0] for q in QUESTIONS], [q[1] for q in QUESTIONS]
    assert asked == words + words + paraphrases                      # then round again
    assert workshop_prompt(3 * n + 4) == words[4]
    assert set(words).isdisjoint(paraphrases)


def test_workshop_sessions_count_requests_on_across_runs():
    w = Workshop()
    first = w.prompts(4)
    assert first == [workshop_prompt(r) for r in range(4)]
    assert w.prompts(4) == first                                     # unanswered: the same run again
    w.answered(["a", None, "c", "d"])                                # a failed client's request is spent too
    assert w.prompts(16) == [workshop_prompt(r) for r in range(4, 20)]
    w.answered([None] * 16)
    assert w.prompts(1) == [workshop_prompt(20)] and w.chat


def test_an_agent_revises_its_own_last_answer():
    a = Agentic()
    assert a.prompts(3) == [q[0] for q in QUESTIONS[:3]]
    a.answered(["first answer ", None, "third answer"])
    again = a.prompts(3)
    assert again == [REVISE + "first answer", QUESTIONS[1][0], REVISE + "third answer"]
    assert again[0] == revision_prompt("first answer") and again[0].endswith("\n\nfirst answer")
    a.answered(["revised", "second answer", None])                   # a failed turn revises the same answer again
    assert a.prompts(3) == [REVISE + "revised", REVISE + "second answer", REVISE + "third answer"]
    assert a.prompts(4)[3] == QUESTIONS[3][0]                        # a session that joins starts with a question


def test_workloads_are_made_fresh_by_name():
    assert WORKLOADS == ("code", "workshop", "agentic") and make_workload("code") is None
    assert isinstance(make_workload("workshop"), Workshop) and make_workload("agentic") is not make_workload("agentic")
    with pytest.raises(ValueError, match="workload must be one of code, workshop, agentic"):
        make_workload("chat")


def test_a_run_s_figures_keep_each_client_s_answer_and_merge_drops_them():
    ok = {"ok": True, "tokens": 10, "itl_s": [0.1, 0.2], "ttft_s": 0.5, "tpot_s": 0.15, "started_at": 1.0,
          "done_at": 3.0, "error": None, "mean_acceptance_length": 2.0, "text": "an answer"}
    failed = {"ok": False, "tokens": 0, "itl_s": [], "ttft_s": None, "error": "refused", "text": None}
    f = figures(2, [ok, failed])
    assert f["texts"] == ["an answer", None] and f["errors"] == 1 and f["tokens_per_s"] == pytest.approx(5.0)
    merged = merge([f, f])
    assert "texts" not in merged and merged["errors"] == 2 and merged["itl_s"]["n"] == 4


def test_adaptive_schedules_are_compared_with_the_fastest_fixed_gamma_at_each_concurrency():
    rows = [{"gamma": g, "concurrency": c, "tokens_per_s": t} for g, c, t in [
        ("none", 1, 100.0), (2, 1, 150.0), (4, 1, 120.0), ("batch", 1, 147.0), ("acceptance", 1, 90.0),
        ("none", 16, 400.0), (2, 16, 300.0), (4, 16, None), ("batch", 16, 404.0), ("acceptance", 16, None)]]
    got = over_best_fixed(rows, ("none", 2, 4), ("acceptance", "batch"))
    assert list(got) == [("acceptance", 1), ("acceptance", 16), ("batch", 1), ("batch", 16)]
    assert got["batch", 1] == pytest.approx(0.98) and got["batch", 16] == pytest.approx(1.01)
    assert got["acceptance", 1] == pytest.approx(0.6) and got["acceptance", 16] is None
