"""`bench suffix`'s plan and figures (engine/experiments/workshop.py): the order of its runs and what it reports
from them, on runs made up here (the bench itself runs a real server)."""
from engine.experiments.workshop import METHODS, PHASES, QUESTIONS, prompt_of, run_order, workshop_figures


def test_every_question_has_a_paraphrase_and_the_paraphrase_phase_asks_it():
    assert len(QUESTIONS) == 10 and all(q != p for q, p in QUESTIONS)
    assert [prompt_of(QUESTIONS[0], ph) for ph in PHASES] == [QUESTIONS[0][0], QUESTIONS[0][0], QUESTIONS[0][1]]


def test_runs_keep_the_phases_in_order_and_take_the_methods_in_turns():
    order = run_order(questions=2, rounds=2)
    assert len(order) == len(set(order)) == 2 * 2 * len(PHASES) * len(METHODS)
    for r in range(2):
        for q in range(2):
            for m in METHODS:       # a method's first asking of a question comes before its asking again
                assert [ph for r_, q_, ph, m_ in order if (r_, q_, m_) == (r, q, m)] == list(PHASES)
    blocks = [[m for *_, m in order[i:i + len(METHODS)]] for i in range(0, len(order), len(METHODS))]
    assert blocks[0] == list(METHODS) and blocks[1] == list(METHODS)[::-1] and blocks[2] == list(METHODS)


def test_figures_pair_suffix_with_plain_and_n_gram_and_check_the_text():
    speed = {"plain": 10.0, "ngram": 12.0, "suffix": 24.0}
    runs = {(r, q, ph, m): {"tokens_per_s": speed[m] * (1 + r), "num_drafts": 0 if m == "plain" else 4,
                            "num_accepted_tokens": {"plain": 0, "ngram": 2, "suffix": 8}[m],
                            "text": "other" if (ph, m, q) == ("paraphrase", "suffix", 1) else f"answer {q}"}
            for r, q, ph, m in run_order(questions=2, rounds=3)}
    f = workshop_figures(runs)
    again = f["again"]
    assert again["suffix_over_plain"]["median"] == 2.4 and again["suffix_over_plain"]["verdict"] == "faster"
    assert again["suffix_over_ngram"]["median"] == 2.0 and len(again["suffix_over_ngram"]["values"]) == 6
    assert again["tokens_per_s"]["plain"] == 20.0                           # the median of 10, 20, 30
    assert again["mean_acceptance_length"] == {"ngram": 1.5, "suffix": 3.0}   # 1 + accepted / drafts, pooled
    assert again["identical"] and not f["paraphrase"]["identical"]
    runs[0, 0, "first", "suffix"]["tokens_per_s"] = None                      # a failed run: not measured
    assert workshop_figures(runs)["first"]["suffix_over_plain"]["median"] is None
