"""The teaching views' endpoints (app/routers/teach/), recordings and replay (app/views/recording.py,
app/views/replay.py), in memory: recordings, the inspector, the seeds' figures where the views show them, the cost
model. tests/test_teach_runs.py has the views that run the engine; the browser tests are in tests/e2e."""
from __future__ import annotations

import json
import re
import time

import pytest

from app.presets import DEFAULT_PROMPT
from app.views.recording import MAX_EVENTS, RECORDINGS, Recording, RecordingError, RecordingStore
from app.views.replay import replay_frames, rounds_of
from engine.kv.memory import paging_waste, seed_request_mix
from engine.serving.session import GenerationSession
from teach_views import PROMPT, client, engine, figure, recorded, run_events, show_run, tokens_of  # noqa: F401 (fixtures)


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
