"""The teaching views that run the engine (faults, race, shoot-out, theory, the distribution check) and the page's
views by URL (app/routers/teach/), in memory; tests/test_teach.py has recordings, the inspector and the figures."""
from __future__ import annotations

import re
import time

import pytest

from app.config import AppConfig
from app.main import create_app
from app.presets import DEFAULT_PROMPT
from app.routers.teach.common import RUNS
from teach_views import PROMPT, TOKEN_RE, client, engine, figure, recorded, run_events, show_run  # noqa: F401


# --- faults, race, distribution ---------------------------------------------------------------------------------
# the page's default prompt: there the shipped draft is rejected within the first tokens, which the faults need
FORM = {"prompt": DEFAULT_PROMPT, "method": "draft_model", "num_speculative_tokens": "4", "max_tokens": "40",
        "temperature": "0", "seed": "0", "kv_cache": "true", "enable_prefix_caching": "true"}


def test_faults_beside_a_correct_run_with_the_divergence_marked(client):
    html = client.post("/teach/faults", data={**FORM, "fault": "no_truncate"}).text
    d = re.search(r'data-divergence="(\d*)"', html).group(1)
    assert d != "" and "First difference at output token" in html
    lanes = re.findall(r'data-lane="(\w+)">(.*?)</div>', html, re.S)
    ref, bad = (TOKEN_RE.findall(body) for _, body in lanes)
    assert ref[:int(d)] == bad[:int(d)] and ref[int(d)] != bad[int(d)]
    assert html.count("diverge") >= 2 and "forgot truncate" in html    # both lanes marked; the seed's symptom
    html = client.post("/teach/faults", data={**FORM, "fault": "unnormalized_residual"}).text
    assert "Probabilities do not sum to 1" in html and "temperature 1.0" in html
    assert "fault: one of" in client.post("/teach/faults", data={**FORM, "fault": "none"}).text
    assert "max_tokens" in client.post("/teach/faults", data={**FORM, "max_tokens": "lots", "fault": "no_truncate"}).text


def test_the_race_runs_plain_and_speculative_on_their_engine_clocks(client):
    html = client.post("/teach/race", data=FORM).text                  # no pair named: plain against the draft
    lanes = dict(re.findall(r'data-lane="(\w+)" data-total-ms="([\d.]+)"', html))
    assert set(lanes) == {"a", "b"} and all(float(v) > 0 for v in lanes.values())
    assert re.findall(r'<h3>(.*?)</h3>', html) == ["plain decoding", "draft model"]
    stamps = {role: [float(t) for t in re.findall(r'data-t="([\d.]+)"', body)]
              for role, body in re.findall(r'data-lane="(\w+)".*?<div class="stream race-stream">(.*?)</div>', html, re.S)}
    assert all(s == sorted(s) and s[-1] == pytest.approx(float(lanes[r]), abs=0.01) for r, s in stamps.items())
    assert len(stamps["a"]) == len(stamps["b"]) == 40
    assert "exactly the same text" in html                               # greedy: speculative == plain
    assert re.search(r"over (\d+) interleaved rounds.*Each side ran \1 times, interleaved", html, re.S)


def test_the_shootout_runs_every_method_of_the_model_with_identical_greedy_output(client):
    html = client.post("/teach/shootout", data={**FORM, "model": "target-mha", "num_speculative_tokens": "3"}).text
    rows = dict(re.findall(r'<tr data-method="(\w+)">(.*?)</tr>', html, re.S))
    assert list(rows) == ["none", "ngram", "draft_model", "medusa", "eagle", "eagle_tree"]   # target-mha ships heads
    assert all(re.search(r'data-figure="identical">yes<', r) for r in rows.values())
    for m in ("draft_model", "medusa", "eagle"):
        assert float(re.search(r'data-figure="mal">([\d.]+)<', rows[m]).group(1)) >= 1.0
        # measured: the comparison's median, its spread and verdict; predicted: the formula, labelled apart
        assert re.search(r'data-figure="measured" data-median="[\d.]+" data-low="[\d.]+" data-high="[\d.]+"><strong class="\w+" data-verdict="[\w ]+">[\d.]+×</strong> '
                         r'<span class="hint">[\d.]+–[\d.]+', rows[m])
        assert re.search(r'data-figure="predicted">[\d.]+×<', rows[m])
        assert re.search(r'data-figure="verify_ratio">[\d.]+ <span class="hint">\([\d.]+\)</span>', rows[m])
    assert "3.57" in rows["eagle"] and "2.32" in rows["medusa"]                       # Spec-Bench beside ours
    assert re.search(r"ran \d+ times, interleaved", html) and 'title="L ÷ (k c + verify ÷ t(1))' in html


def test_theory_measures_a_run_against_plain_decoding_of_the_same_prompt_and_settings(recorded, client):
    rec, events, _ = recorded
    d = client.get("/teach/plain.json", params={"recording": rec.key}).json()
    run = events[-1].summary
    assert d["page_ms_per_token"] == pytest.approx(run["elapsed_s"] * 1e3 / run["num_output_tokens"])
    # both sides timed by the comparison (interleaved rounds), the page's own run only shown beside them
    assert d["plain_ms_per_token"] > 0 and d["run_ms_per_token"] > 0 and d["repeats"] >= 3
    assert d["low"] <= d["median"] <= d["high"] and f"over {d['repeats']} interleaved rounds" in d["text"]
    assert client.get("/teach/plain.json", params={"recording": rec.key}).json() == d        # timed once
    assert client.get("/teach/plain.json", params={"recording": "nope"}).status_code == 404
    html = client.get("/?view=theory").text
    assert 'id="theory-measure"' in html and ">estimated</th>" in html


def test_a_race_of_any_two_settings_names_its_pair_and_quotes_the_engine(client):
    from app.config import AppConfig
    from engine.kv.dtypes import kv_bytes_per_token
    from engine.model.checkpoint import load_config

    models = AppConfig.from_env().models_dir                          # the client's models (configs only)
    cfg = {c.num_key_value_heads: c for c in (load_config(models / name) for name in ("target-mha", "target-mqa"))}
    mha = max(cfg)
    form = {**FORM, "model": "target-mha", "race": "num_kv_heads", "race_a": str(mha), "race_b": "1"}
    html = client.post("/teach/race", data=form).text
    assert re.findall(r'<h3>(.*?)</h3>', html) == [f"MHA ({mha} KV heads)", "MQA (1 KV head)"]
    kv = [int(x) for x in re.findall(r'data-figure="kv_bytes_per_token">(\d+)<', html)]
    assert kv == [kv_bytes_per_token(cfg[mha], "auto"), kv_bytes_per_token(cfg[1], "auto")]
    assert f"MQA (1 KV head): {kv[0] / kv[1]:.1f}× fewer KV bytes/token" in html
    html = client.post("/teach/race", data={**FORM, "race": "kv_cache_dtype", "race_a": "auto", "race_b": "fp8_e4m3"}).text
    assert "fp8 (e4m3) cache: 4.0× fewer KV bytes/token" in html
    html = client.post("/teach/race", data={**FORM, "race": "kv_cache", "race_a": "true", "race_b": "false"}).text
    assert "KV cache off: no KV cache held" in html and "exactly the same text" in html
    for bad, message in (({"race": "top_p"}, "race: one of"), ({"race": "num_kv_heads", "race_a": "1", "race_b": "1"},
                                                               "two different values"),
                         ({"race": "num_kv_heads", "race_a": "1", "race_b": "5"}, "num_kv_heads")):
        assert message in client.post("/teach/race", data={**FORM, **bad}).text
    with RUNS.taken():                     # another run holds the turn: bad input is still answered as such
        assert "race: one of" in client.post("/teach/race", data={**FORM, "race": "top_p"}).text


def test_the_distribution_check_runs_in_the_background(client):
    form = {"prefix": "import ", "sample_temperature": "1", "samples": "5000", "sample_seed": "1"}
    html = client.post("/teach/distribution", data=form).text
    job = re.search(r"/teach/distribution/(\w+)", html).group(1)
    assert 'data-state="running"' in html and "<progress" in html
    deadline = time.monotonic() + 30
    while 'data-state="done"' not in html:
        assert time.monotonic() < deadline, "the check did not finish"
        time.sleep(0.05)
        html = client.get(f"/teach/distribution/{job}").text
    acceptance, theory = float(figure(html, "acceptance_rate")), float(figure(html, "theory"))
    assert abs(acceptance - theory) < 0.03                               # 5,000 samples: sd about 0.006
    assert float(figure(html, "tvd_speculative")) < float(figure(html, "tvd_draft_only"))
    assert "first seed" in html and "0.8987" in html                     # the seed's row for the same prefix
    assert html.count('class="bar-spec"') == 8 and "the rest of the vocabulary" in html   # the top 8 tokens
    again = client.post("/teach/distribution", data=form).text            # the same check: its answer at once
    assert 'data-state="done"' in again
    assert "needs sampling" in client.post("/teach/distribution", data={**form, "sample_temperature": "0"}).text
    assert "samples" in client.post("/teach/distribution", data={**form, "samples": "10"}).text


# --- the page: views by URL, hideable ---------------------------------------------------------------------------
def panels(html: str) -> dict[str, bool]:
    """Each view panel: shown (True) or hidden."""
    return {m.group(1): "hidden" not in m.group(0)
            for m in re.finditer(r'<section id="view-(\w+)"[^>]*>', html)}


def test_a_view_opens_by_url_and_can_be_hidden(client):
    html = client.get("/?view=theory").text
    shown = panels(html)
    assert len(shown) == 10 and [n for n, s in shown.items() if s] == ["theory"]
    assert re.search(r'id="tab-theory"[^>]*aria-selected="true"', html)
    assert 'href="?view=race"' in html                                   # each tab is a link
    assert "0.88" in html and "slower" in html                            # the second seed's worked table
    html = client.get("/embed?view=race&hide=tabs").text
    assert re.search(r'<nav class="teach-tabs" data-part="tabs" hidden', html) and panels(html)["race"]
    html = client.get("/?view=race&hide=race").text
    assert not any(panels(html).values()) and 'id="tab-race"' not in html
    html = client.get("/?hide=views&view=theory").text
    assert re.search(r'<section id="teach" class="teach" data-part="views" hidden', html)
    html = client.get("/?view=nope").text
    assert "warning-banner" in html and "ignored view=" in html


def test_theory_shows_suffix_decoding_s_draft_length_by_match_length(client, engine):
    """A suffix decoding run recorded by the page: theory.json gives every drafting round's match length and draft
    length (the draft events' own), each within the rule's bound; the view has the chart it draws them in. A run of
    another method has no such series."""
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = run_events(engine, method="suffix", num_speculative_tokens=6, max_tokens=80)
    show_run(view, events)
    series = client.get(f"/teach/theory.json?recording={view.recording.key}").json()["suffix"]
    drafts = [e for e in events if e.type == "draft"]
    rounds = {e.round: e for e in events if e.type == "round"}
    assert series["match_len"] == [d.origin["match_len"] for d in drafts]
    assert series["drafted"] == [rounds[d.round].num_draft_tokens for d in drafts] == [len(d.tokens) for d in drafts]
    assert all(0 <= n <= b for n, b in zip(series["drafted"], series["bound"]))
    assert sum(series["drafted"]) > 0 and (series["gamma"], series["max_tree_depth"]) == (6, 24)
    assert [b["match_len"] for b in series["by_match"]] == sorted(set(series["match_len"]))
    html = client.get("/?view=theory").text
    assert 'id="theory-suffix"' in html and 'id="theory-suffix-figure"' in html
    show_run(view, run_events(engine, method="ngram", max_tokens=20))
    assert client.get(f"/teach/theory.json?recording={view.recording.key}").json()["suffix"] is None
