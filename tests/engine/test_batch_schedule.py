"""The `batch` γ schedule (engine/spec_decode/batch_schedule.py): vLLM's per-batch-size table as a pure lookup, the
table a sweep's fastest cells make, its file, and in sessions: γ by the sessions running on the model."""
import json

import pytest

from engine.serving.session import GenerationSession
from engine.spec_decode import batch_schedule
from engine.spec_decode.batch_schedule import (BatchSchedule, fastest_gamma, load_table, num_speculative_tokens_for,
                                               store_table, table_from_sweep, validated_table)
from engine.spec_decode.schedule import make_schedule


def test_the_lookup_follows_vllm_s_ranges_gaps_and_tail_capped_by_the_setting():
    table = validated_table([[32, 128, 2], [1, 16, 3]])          # unsorted, with a gap 17-31
    assert table == [(1, 16, 3), (32, 128, 2)]
    got = {n: num_speculative_tokens_for(table, n, 16) for n in (1, 16, 17, 31, 32, 128, 129, 1000)}
    assert got == {1: 3, 16: 3, 17: 3, 31: 3, 32: 2, 128: 2, 129: 2, 1000: 2}
    assert num_speculative_tokens_for(table, 1, 2) == 2          # never above num_speculative_tokens
    assert num_speculative_tokens_for(validated_table([[1, 3, 4], [4, 4, 0]]), 9, 16) == 0


@pytest.mark.parametrize("entries, says", [
    ([], "non-empty"), ([[2, 4, 1]], "start at 1"), ([[1, 4, 1], [4, 8, 2]], "overlap"),
    ([[1, 4]], "each entry"), ([[1, 4, -1]], ">= 0"), ([[3, 2, 1]], "range_start <= range_end"), ("1-4:2", "list")])
def test_a_bad_table_is_refused_naming_it(entries, says):
    with pytest.raises(ValueError, match="num_speculative_tokens_per_batch_size") as e:
        validated_table(entries)
    assert says in str(e.value)


def test_a_sweep_s_fastest_cells_make_the_table():
    assert fastest_gamma({"none": 100.0, 2: 130.0, 4: 125.0, 6: None}) == 2
    assert fastest_gamma({"none": 300.0, 2: 250.0, 4: 200.0, 6: 180.0}) == 0
    with pytest.raises(ValueError):
        fastest_gamma({"none": None, 2: None})
    table = table_from_sweep({16: 0, 1: 4, 4: 2})
    assert table == [[1, 3, 4], [4, 15, 2], [16, 16, 0]]
    assert [num_speculative_tokens_for(validated_table(table), n, 6) for n in (1, 3, 4, 15, 16, 40)] == \
        [4, 4, 2, 2, 0, 0]
    assert table_from_sweep({1: 6}) == [[1, 1, 6]]


def test_a_table_is_stored_per_method_beside_the_others(tmp_path):
    store_table("m", "ngram", [[1, 3, 4], [4, 4, 0]], "bench serve --sweep, a run", tmp_path)
    store_table("m", "suffix", [[1, 1, 6]], "another run", tmp_path)
    assert load_table("m", "ngram", tmp_path) == {"table": [(1, 3, 4), (4, 4, 0)],
                                                  "measured": "bench serve --sweep, a run"}
    assert load_table("m", "suffix", tmp_path)["table"] == [(1, 1, 6)]
    assert load_table("m", "eagle", tmp_path) is None and load_table("other", "ngram", tmp_path) is None
    (tmp_path / "bad.json").write_text('{"by_method": {"ngram": {"num_speculative_tokens_per_batch_size": []}}}')
    assert load_table("bad", "ngram", tmp_path) is None          # a broken table is no table: γ as set


def test_gamma_follows_the_sessions_running_and_the_report_says_why():
    running = [1]
    s = BatchSchedule(6, {"table": validated_table([[1, 3, 4], [4, 15, 2], [16, 16, 0]]), "measured": "a sweep"},
                      lambda: running[0])
    assert s.k == 4 and s.report() == {"schedule": "batch", "why": "table", "batch_size": 1, "range": [1, 3],
                                       "measured": "a sweep"}
    for n, k, why in ((4, 2, "table"), (20, 0, "off"), (2, 4, "table")):
        running[0] = n
        s.observe(k, 0)                                          # γ is looked up before each round, whatever it did
        assert (s.k, s.report()["why"], s.report()["batch_size"]) == (k, why, n)
    unmeasured = BatchSchedule(5, None, lambda: 9)
    assert unmeasured.k == 5 and unmeasured.report()["why"] == "unmeasured"


def test_make_schedule_loads_the_model_s_table_for_the_method(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_schedule, "TABLES_DIR", tmp_path)
    store_table("t-mha", "ngram", [[1, 1, 3], [2, 2, 0]], "a sweep")
    assert make_schedule("batch", 8, ("t-mha", "ngram"), lambda: 1).k == 3
    assert make_schedule("batch", 8, ("t-mha", "ngram"), lambda: 2).k == 0
    assert make_schedule("batch", 8, ("t-mha", "draft_model"), lambda: 2).k == 8    # no table for the method


PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def test_a_session_drafts_alone_and_stops_drafting_beside_another(family, tmp_path, monkeypatch):
    """A table that drafts 3 alone and nothing at 2 sessions: a session alone drafts; the same settings while a
    second session is running on the model (a forced state: its generator started, then held) draft nothing, with
    the reason in every metrics event, and greedy text is plain decoding's either way; after the other closes,
    drafting comes back."""
    monkeypatch.setattr(batch_schedule, "TABLES_DIR", tmp_path)
    store_table("t-mha", "draft_model", [[1, 1, 3], [2, 2, 0]], "a sweep")
    engine = family()
    settings = {"method": "draft_model", "num_speculative_tokens": 5, "num_speculative_tokens_schedule": "batch",
                "max_tokens": 40}

    def run():
        events = list(GenerationSession(engine, PROMPT, settings).events())
        assert events[-1].type == "done", events[-1]
        return events

    plain = list(GenerationSession(engine, PROMPT, {"method": "none", "max_tokens": 40}).events())[-1].summary
    alone = run()
    assert alone[-1].summary["text"] == plain["text"]
    drafts = [e.num_draft_tokens for e in alone if e.type == "round"]
    assert max(drafts) == 3 and alone[-1].summary["num_drafts"] > 0
    other = GenerationSession(engine, PROMPT, {"method": "none", "max_tokens": 40}).steps()
    assert next(other).type == "started"                          # running on t-mha from here
    try:
        beside = run()
    finally:
        other.close()                                             # its session closes: no longer running
    assert beside[-1].summary["text"] == plain["text"] and beside[-1].summary["num_drafts"] == 0
    states = [e.values["schedule_state"] for e in beside if e.type == "metrics"]
    assert states and all(s["why"] == "off" and s["batch_size"] == 2 and s["range"] == [2, 2] for s in states)
    assert engine.running.batch_size("t-mha", "none of them") == 1             # no session left on t-mha
    assert max(e.num_draft_tokens for e in run() if e.type == "round") == 3


def test_the_shipped_tables_are_valid_and_say_where_they_were_measured():
    files = sorted(batch_schedule.TABLES_DIR.glob("*.json"))
    assert files
    for f in files:
        for method in json.loads(f.read_text())["by_method"]:
            table = load_table(f.stem, method)
            assert table is not None and table["measured"].startswith("bench serve --sweep"), (f, method)
