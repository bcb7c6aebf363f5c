"""The teaching views' endpoints (app/routers/teach/), recordings and replay (app/views/recording.py, app/views/replay.py),
in memory. The seeds' figures are checked where the views show them; the browser tests are in tests/e2e."""
from __future__ import annotations

import json
import re
import time
from html import unescape

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app
from app.presets import DEFAULT_PROMPT
from app.protocol import Batch, RenderContext
from app.routers.teach.common import RUNS
from app.views.html import HtmlView
from app.views.recording import MAX_EVENTS, RECORDINGS, Recording, RecordingError, RecordingStore
from app.views.replay import replay_frames, rounds_of
from engine.kv.memory import paging_waste, seed_request_mix
from engine.serving.session import GenerationSession

PROMPT = "def parse(line):\n    "
TOKEN_RE = re.compile(r'<span class="tok[^"]*" data-token-status="(\w+)"[^>]*>(.*?)</span>', re.S)


@pytest.fixture(scope="module")
def client(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        yield c


@pytest.fixture(scope="module")
def engine(client):
    return client.app.state.playground.engine


RUNNING = RenderContext(run_id=1, state="running")     # what the view knows of its connection


def show_run(view: HtmlView, events) -> list[str]:
    """What the page's connection does with a run: its rounds rendered one message each."""
    out = []
    for chunk in rounds_of(events):
        out += view.render([Batch(1, chunk)], RUNNING)
    return out


def run_events(engine, **settings):
    settings = {"max_tokens": 40, "method": "draft_model", "num_speculative_tokens": 3, **settings}
    return list(GenerationSession(engine, PROMPT, settings).events())


@pytest.fixture(scope="module")
def recorded(client, engine):
    """A sampled run as the live page showed it, and the view that recorded it."""
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = run_events(engine, temperature=1.0, seed=3, max_tokens=120)
    messages = show_run(view, events)
    return view.recording, events, messages


def tokens_of(messages) -> list[tuple[str, str]]:
    return [(s, unescape(t)) for m in messages for s, t in TOKEN_RE.findall(m)]


# --- recording ------------------------------------------------------------------------------------------------
def test_the_page_view_records_each_run_once(recorded, client, engine):
    rec, events, messages = recorded
    assert rec is not None and rec.complete and not rec.truncated
    assert [e.type for e in rec.events] == [e.type for e in events]
    assert RECORDINGS.get(rec.key) is rec and rec.prompt == PROMPT
    assert f'data-recording="{rec.key}"' in messages[0]                 # the stream says which recording it is
    assert f'/teach/recordings/{rec.key}.json' in messages[-1] and 'data-complete="1"' in messages[-1]
    # a second view of the same run (a room's broadcaster, a watcher) refers to it and records nothing
    other = client.app.state.playground.view("html")
    show_run(other, events)
    assert other.recording is rec and len(rec.events) == len(events)
    # the pools as drawn after the run freed its blocks are kept for replay
    assert rec.snapshots and all(p["block_table"] == [] for p in rec.snapshots.values())


def test_the_store_keeps_recent_recordings_within_its_budget():
    store = RecordingStore(max_events=100, max_recordings=3)
    recs = []
    for i in range(5):
        rec, owner = store.claim(f"session-{i}")
        assert owner
        recs.append(rec)
    assert store.get(recs[0].key) is None and store.get(recs[-1].key) is recs[-1]
    assert store.claim("session-4") == (recs[-1], False)
    big, _ = store.claim("big")
    big.events = [None] * 150          # over budget alone: kept (the newest), the others go
    store.put(big)
    assert store.get(big.key) is big and store.get(recs[-1].key) is None


def test_a_recording_is_cut_at_its_event_limit():
    rec = Recording("k")
    from engine.serving.events import Metrics
    for _ in range(MAX_EVENTS + 5):
        rec.add(Metrics({}))
    assert len(rec.events) == MAX_EVENTS and rec.truncated


# --- export and replay ------------------------------------------------------------------------------------------
def test_export_then_replay_shows_the_same_tokens_and_statuses(recorded, client):
    rec, events, messages = recorded
    response = client.get(f"/teach/recordings/{rec.key}.json")
    assert response.status_code == 200 and "attachment" in response.headers["content-disposition"]
    data = response.json()
    assert data["format"] == "decoding-playground/recording" and data["version"] == 1
    assert data["settings"]["temperature"] == 1.0 and data["settings"]["seed"] == 3
    assert data["prompt"] == PROMPT and len(data["events"]) == len(events) and data["complete"]
    first = client.post("/teach/replays", content=response.content, headers={"X-File-Name": "run.json"}).json()
    second = client.post("/teach/replays", content=response.content, headers={"X-File-Name": "run.json"}).json()
    assert first["frames"] == second["frames"]                          # replays of the same file are identical
    assert first["rounds"] == rec.num_rounds and first["complete"]
    live = tokens_of(messages)
    assert {s for s, _ in live} >= {"accepted", "rejected", "target"}
    assert tokens_of(first["frames"]) == live                            # same tokens, same statuses, same order
    assert "Replay done" in first["frames"][-1]
    # the replay's stream is its own recording: the inspector works on it
    assert f'data-recording="{first["key"]}"' in first["frames"][0]
    assert client.get(f"/teach/recordings/{first['key']}.json").json()["events"] == data["events"]


def test_replay_needs_no_engine(recorded):
    rec, _, messages = recorded
    again = Recording.from_json(json.loads(json.dumps(rec.to_json(), default=float)))
    frames = replay_frames(again)                    # no playground, no engine: only the recorded events
    assert tokens_of(frames) == tokens_of(messages)
    assert len(frames) == len(rounds_of(rec.events))


def test_a_partial_recording_replays_up_to_where_it_ends(recorded):
    rec, _, _ = recorded
    data = rec.to_json()
    data["events"] = data["events"][:40]
    data["complete"] = False
    frames = replay_frames(Recording.from_json(data))
    assert "the recording ends here" in frames[-1] and 'data-state="done"' in frames[-1]


@pytest.mark.parametrize("body, message", [
    (b"not json", "cannot replay"),
    (json.dumps({"format": "something else"}).encode(), "not a recording"),
    (json.dumps({"format": "decoding-playground/recording", "version": 99, "events": []}).encode(), "version"),
    (json.dumps({"format": "decoding-playground/recording", "version": 1, "events": [{"type": "nope"}]}).encode(),
     "event 0"),
    (json.dumps({"format": "decoding-playground/recording", "version": 1,
                 "events": [{"type": "metrics", "values": {}}]}).encode(), "started"),
    (json.dumps({"format": "decoding-playground/recording", "version": 1,
                 "events": [{"type": "started", "session_id": "s", "settings": "nonsense", "model": {},
                             "draft_model": None, "prompt_tokens": 5}]}).encode(),
     "event 0 (started): settings must be an object, not a string"),
    (json.dumps({"format": "decoding-playground/recording", "version": 1,
                 "events": [{"type": "started", "session_id": "s", "settings": {}, "model": {},
                             "draft_model": None, "prompt_tokens": [{}]}]}).encode(), "do not render"),
])
def test_a_file_that_is_not_a_recording_is_refused_with_its_reason(client, body, message):
    response = client.post("/teach/replays", content=body)
    assert response.status_code == 400 and message in response.json()["error"]


def test_recording_errors_are_value_errors():
    with pytest.raises(RecordingError):
        Recording.from_json([])


# --- token inspector ---------------------------------------------------------------------------------------------
def test_the_inspector_shows_a_tokens_probabilities_test_and_distributions(recorded, client):
    rec, events, _ = recorded
    tokens = [e for e in events if e.type == "token"]
    accepted = next(t for t in tokens if t.status == "accepted")
    html = client.get("/teach/inspect", params={"recording": rec.key, "round": accepted.round,
                                                "position": accepted.position, "status": "accepted"}).text
    assert f'data-figure="p">{accepted.p:.3f}<' in html and f'data-figure="q">{accepted.q:.3f}<' in html
    assert f'data-figure="r">{accepted.r:.3f}<' in html and f"{accepted.accept_prob:.3f}" in html
    assert "→ <strong>accepted</strong>" in html and "Target p" in html and "Draft q" in html
    assert html.count('<li class="is-token">') >= 1                     # x marked in the top-5 lists
    resampled = next(t for t in tokens if t.status == "resampled")
    html = client.get("/teach/inspect", params={"recording": rec.key, "round": resampled.round,
                                                "position": resampled.position, "status": "resampled"}).text
    assert "Residual" in html and "norm(max(0, p − q))" in html
    assert html.count('class="bar-residual"') == len(resampled.residual_top)
    rejected = next(t for t in tokens if t.status == "rejected")
    html = client.get("/teach/inspect", params={"recording": rec.key, "round": rejected.round,
                                                "position": rejected.position, "status": "rejected"}).text
    assert "→ <strong>rejected</strong>" in html and "The target's replacement" in html


def test_the_inspector_says_a_greedy_replacement_was_the_targets_argmax_not_a_draw(client, engine):
    for prompt in (DEFAULT_PROMPT, PROMPT, "x"):        # the first whose greedy run has a rejected draft token
        events = list(GenerationSession(engine, prompt, {"max_tokens": 120, "method": "draft_model",
                                                         "num_speculative_tokens": 4, "temperature": 0}).events())
        resampled = next((e for e in events if e.type == "token" and e.status == "resampled"), None)
        if resampled:
            break
    assert resampled, "no greedy run rejected a draft token"
    view = client.app.state.playground.view("html")
    view.form_prompt = prompt
    show_run(view, events)
    html = client.get("/teach/inspect", params={"recording": view.recording.key, "round": resampled.round,
                                                "position": resampled.position, "status": "resampled"}).text
    why = re.search(r'<p class="insp-why">(.*?)</p>', html, re.S).group(1)
    assert "Temperature 0: nothing is drawn" in why and "the target's argmax, this token, replaced it" in why
    assert "residual" not in why and "Residual" not in html and resampled.residual_top == []


def test_the_inspector_explains_what_it_cannot_show(client, recorded):
    rec, _, _ = recorded
    gone = client.get("/teach/inspect", params={"recording": "nope", "round": 1, "position": 1, "status": "accepted"})
    assert gone.status_code == 200 and "no longer kept" in gone.text
    missing = client.get("/teach/inspect", params={"recording": rec.key, "round": 999, "position": 1,
                                                   "status": "accepted"})
    assert "no accepted token at round 999" in missing.text


def test_the_inspector_shows_what_the_standard_rule_would_have_done_with_a_block_rounds_draws(client, engine):
    events = run_events(engine, temperature=1.0, seed=3, max_tokens=200, num_speculative_tokens=4,
                        rejection_sample_method="block")
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    show_run(view, events)

    def inspect(token):
        return client.get("/teach/inspect", params={"recording": view.recording.key, "round": token.round,
                                                    "position": token.position, "status": token.status}).text

    drafts = [e for e in events if e.type == "token" and e.stop_prob is not None]
    for status in ("accepted", "rejected"):
        token = next(t for t in drafts if t.status == status)
        html = inspect(token)
        assert f'data-figure="stop_prob">{token.stop_prob:.3f}<' in html and "Block verification" in html
        assert f'data-standard-status="{token.standard_status}"' in html
    # a draft the block kept although token-by-token verification rejected it or never tried it
    kept = next(t for t in drafts if t.status == "accepted" and t.standard_status != "accepted")
    assert f"<strong>{'never tried' if kept.standard_status == 'unreached' else 'rejected'}</strong>" in inspect(kept)
    resampled = next(e for e in events if e.type == "token" and e.status == "resampled")
    assert "norm(max(0, b·p − q))" in inspect(resampled)


# --- KV memory and paging: the seeds' figures ------------------------------------------------------------------
def figure(html: str, name: str) -> str:
    m = re.search(rf'data-figure="{name}"[^>]*>([^<]*)<', html)
    assert m, name
    return m.group(1)


def test_the_memory_calculator_reproduces_the_seeds(client):
    html = client.get("/teach/memory").text                            # Qwen3-8B, 32,768 x 16, bf16
    assert figure(html, "bytes_per_token") == "144 KiB" and figure(html, "kv_bytes") == "72 GiB"
    # 8.2 billion parameters x 2 bytes, and the total that must fit adds the same 16.4 GB
    assert figure(html, "weight_bytes") == "16.4 GB" and figure(html, "total_bytes") == "93.7 GB"
    html = client.get("/teach/memory", params={"dtype": "int8_per_token_head", "draft": "Llama-3.2-1B"}).text
    assert "× (128 head dim × 1 B + 2 B scale)" in html                  # one float16 scale per token and head,
    assert figure(html, "draft_bytes_per_token") == "16.5 KiB"           # for the draft (16 × 2 × 8 × 66 B)
    ours = re.search(r'<ul class="ours">(.*?)</ul>', html, re.S).group(1)     # and for our models
    assert ours.count(" head dim × 1 B + 2 B scale)") == ours.count("<li>") > 0 and "+ scales" not in html
    html = client.get("/teach/memory", params={"config": "Llama-3.1-8B", "context": 8192, "sequences": 1,
                                               "dtype": "float16", "draft": "Llama-3.2-1B"}).text
    assert figure(html, "bytes_per_token") == "128 KiB" and figure(html, "kv_bytes") == "1 GiB"
    assert figure(html, "draft_bytes_per_token") == "32 KiB" and figure(html, "draft_kv_bytes") == "256 MiB"
    assert figure(html, "draft_weight_bytes") == "2.5 GB"
    html = client.get("/teach/memory", params={"config": "gpt-oss-20b", "context": 131072, "sequences": 1}).text
    assert figure(html, "kv_bytes") in ("3.00 GiB", "3 GiB", "2.99 GiB") and "window of 128" in html
    assert "target-mha" in html                                          # our own models, by the same formula


def test_the_memory_calculator_names_bad_values_and_keeps_going(client):
    response = client.get("/teach/memory", params={"config": "GPT-9", "context": "lots", "sequences": 0})
    assert response.status_code == 200
    assert "config: one of" in response.text or "model: one of" in response.text
    assert "context: 1 to" in response.text and "sequences: 1 to" in response.text


def test_paging_waste_on_the_seed_mix_and_live(client, recorded):
    html = client.get("/teach/paging").text
    lengths = seed_request_mix()
    for size, seed in ((None, "47.2%"), (16, "0.7%"), (32, "1.4%")):
        row = re.search(rf'data-block-size="{size or "none"}">(.*?)</tr>', html, re.S).group(1)
        assert seed in row and f"{paging_waste(lengths, size) * 100:.1f}%" in row
    rec, _, _ = recorded
    live = client.get("/teach/paging/live", params={"recording": rec.key}).text
    assert "This run" in live and "blocks of" in live
    assert "target:target-mha" in live                                   # every pool of the engine, now


# --- cost model ------------------------------------------------------------------------------------------------
def test_verify_cost_curve_is_measured_once_per_model(client):
    first = client.get("/teach/curve.json").json()
    assert first["model"] and first["target_ms"]["1"] > 0 and len(first["target_ms"]) == 17
    assert first["c"] > 0 and first["draft"]
    # physical: one forward over n tokens costs at least one over 1 token, within the noise the curve states
    t = {int(n): ms for n, ms in first["target_ms"].items()}
    assert first["physical"] and first["violations"] == [] and 0 < first["noise"] < 0.5
    assert all(t[n] >= t[1] * (1 - first["noise"]) for n in t)
    assert first["repeats"] >= 11 and first["taken_at"] > 0 and len(first["load_average"]) == 3 and first["cores"] >= 1
    assert client.get("/teach/curve.json").json() == first               # cached: measured once
    assert client.get("/teach/curve.json", params={"model": "nope"}).status_code == 404


def test_cost_model_projects_a_memory_bound_accelerator(client):
    html = client.get("/teach/cost", params={"alpha": "0.8", "gamma": "4", "batch": "1"}).text
    assert "projection" in html.lower() and "measured here" in html
    assert float(figure(html, "verify_ratio_there")) == pytest.approx(1.0, abs=0.01)   # 5 tokens cost one step
    assert 1.5 < float(figure(html, "speedup_there").rstrip("×")) < 3.0             # the papers' 2-3x
    assert float(figure(html, "verify_ratio_here")) > 1                              # not free here
    busy = client.get("/teach/cost", params={"alpha": "0.8", "gamma": "4", "batch": "256", "context": "512"}).text
    assert float(figure(busy, "verify_ratio_there")) > 2
    assert float(figure(busy, "speedup_there").rstrip("×")) < float(figure(html, "speedup_there").rstrip("×"))
    # empty or odd values fall back to defaults
    assert client.get("/teach/cost", params={"alpha": "", "gamma": "x", "batch": "-3"}).status_code == 200


def test_the_cost_card_titled_measured_shows_measurements_and_the_formula_apart_as_predicted(client, engine):
    """Issue 29: the "here" card held a formula under "measured on this CPU", computed with γ from the form while
    the run drafted fewer tokens a round, and said the weights sat in the cache beside a line that streams them."""
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = run_events(engine, method="eagle", max_tokens=40, draft_confidence_threshold=0.5)
    show_run(view, events)
    html = client.get("/teach/cost", params={"recording": view.recording.key}).text
    measured = html[html.index('class="cost-card here"'):html.index('class="cost-card here-predicted"')]
    predicted = html[html.index('class="cost-card here-predicted"'):html.index('class="cost-card there"')]
    assert '<span class="tag">measured</span>' in measured and "E /" not in measured and "E =" not in measured
    assert "speedup_here" not in measured and "the Theory view" in measured           # no measured speed-up yet
    assert '<span class="tag">predicted</span>' in predicted and "speedup_run_predicted" in predicted
    rounds = [e for e in events if e.type == "round" and e.num_draft_tokens]
    k = sum(r.num_draft_tokens for r in rounds) / len(rounds)
    assert f"k = {k:.2f} drafted tokens per round" in predicted                   # the run's own, not γ
    assert "sit in the CPU cache" in measured                # target-mha: small, no weights streamed
    note = html[html.index('data-figure="curve_note"'):][:400]
    assert re.search(r"measured \d+ (s|min|h) ago, load average [\d.]+ on \d+ cores", note)     # the curve's age and load


def test_a_curve_that_is_not_physical_is_flagged_and_measured_again_a_minute_later(client):
    import time

    from engine.model.threads import threads

    curves = client.app.state.playground.curves
    good = client.get("/teach/curve.json").json()
    key = (good["model"], threads())
    flagged = {**curves.curves[key], "physical": False, "violations": [2], "taken_at": time.time()}
    curves.curves[key] = flagged
    html = client.get("/teach/cost").text
    assert 'data-figure="curve_flag"' in html and "t(2) came out below t(1)" in html
    assert 'data-figure="verify_ratio_here">–<' in html                     # nothing computed from it
    assert client.get("/teach/curve.json").json()["physical"] is False       # within a minute: kept, flagged
    curves.curves[key] = {**flagged, "taken_at": time.time() - 120}
    again = client.get("/teach/curve.json").json()                           # a minute on: measured again
    assert again["physical"] and again["taken_at"] > good["taken_at"]


def test_the_cost_model_takes_a_head_s_c_from_the_page_s_run(client, engine):
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = run_events(engine, method="eagle", max_tokens=40)
    show_run(view, events)
    rounds = [e for e in events if e.type == "round" and e.num_draft_tokens]
    html = client.get("/teach/cost", params={"recording": view.recording.key, "gamma": "3"}).text
    assert "eagle, measured in the page" in html
    curve = client.get("/teach/curve.json").json()
    c = sum(r.draft_ms for r in rounds) / sum(r.num_draft_tokens for r in rounds) / curve["target_ms"]["1"]
    assert float(figure(html, "c_here")) == pytest.approx(c, abs=0.006)          # shown to 2 decimals
    plain = client.get("/teach/cost", params={"gamma": "3"}).text                # no run: the draft model's
    assert float(figure(plain, "c_here")) == pytest.approx(curve["c"], abs=0.006) and "draft model" in plain


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
