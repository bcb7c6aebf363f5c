"""Offline acceptance (engine/training/head_eval.py): chains counted as greedy verification counts them."""
import numpy as np

from engine.training.head_eval import _chain_acceptance, _draft_vocabulary, _drafts, _summary


def test_a_chain_accepts_drafts_until_the_first_wrong_one():
    # correct[s, t]: draft s + 1 of the chain started at t - s is right
    correct = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool)
    counts = _chain_acceptance(correct, np.ones(4, bool), 2)
    # chains at t = 0: right, wrong; t = 1: right, right; t = 2: wrong (its second draft does not count)
    assert counts[:3].tolist() == [2, 1, 3]
    out = _summary(counts, 2)
    assert out["per_position"] == [round(2 / 3, 4), round(1 / 3, 4)]
    assert out["mean_acceptance_length"] == {1: round(1 + 2 / 3, 3), 2: 2.0}


def test_a_chain_drafts_from_the_subset_and_the_tokens_before_its_start():
    """As the engine's ContextVocabulary: a token outside S counts from the chain whose context holds it."""
    ids = np.array([5, 9, 7, 9, 8])
    rows = np.eye(10, dtype=np.float32)                            # token x's LM head row: e_x
    vocab, vrows, since = _draft_vocabulary(ids, np.array([1, 2]), rows)
    assert vocab.tolist() == [1, 2, 5, 7, 8, 9] and since.tolist() == [-1, -1, 0, 2, 4, 1]
    assert (vrows == rows[vocab]).all()
    logits = np.tile(np.arange(6, dtype=np.float32), (5, 1))      # prefers 9, then 8, 7, 5, then S's 2
    assert _drafts(logits, vocab, since, np.arange(-1, 4)).tolist() == [5, 9, 9, 9, 9]
    assert _drafts(logits[:1], vocab, since, np.array([-2])).tolist() == [2]      # nothing of the context yet


def test_chains_start_only_where_every_drafted_position_is_an_answer_position():
    correct = np.ones((3, 6), bool)
    valid = np.array([0, 1, 1, 1, 1, 0], bool)               # a prompt position first, the answer's end last
    assert _chain_acceptance(correct, valid, 3)[:4].tolist() == [2, 2, 2, 2]


def test_a_run_starts_each_chain_where_the_last_one_stopped():
    correct = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool)
    out = _summary(_chain_acceptance(correct, np.ones(4, bool), 2), 2)
    # γ = 1: chains at t = 0 (right: 2 tokens), 2 (wrong: 1), 3 (right: 2), 5 tokens in 3 rounds;
    # γ = 2: t = 0 (right, wrong: 2 tokens), t = 2 (wrong: 1), then no room for two drafts: 3 in 2
    assert out["run_acceptance_length"] == {1: round(5 / 3, 3), 2: 1.5}
    assert out["mean_acceptance_length"][2] == 2.0                # every start: the easy t = 1 counts too


def test_an_export_keeps_the_warm_start_record_when_the_heads_it_started_from_are_gone(tmp_path):
    import json

    from engine.training.head_cli import warm_start
    first = tmp_path / "first"
    first.mkdir()
    (first / "training.json").write_text(json.dumps({"steps": 730, "train_s": 3600.0,
                                                     "data": {"answer_tokens": 49743}}))
    record = {"steps": 730, "train_s": 3600.0, "answer_tokens": 49743}
    assert warm_start(str(first), tmp_path / "none.json") == record
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({"config": {"init_from": str(first)}, "warm_start": record}))
    (first / "training.json").unlink()
    assert warm_start(str(first), previous) == record                   # the same state exported before
    assert warm_start(str(tmp_path / "other"), previous) is None        # another state's record is not taken
    assert warm_start(None, previous) is None
