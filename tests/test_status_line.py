"""The status line after a chunked prefill (issue 32): prefill progress while the prompt (or the draft model's
catch-up) prefills, then rounds, tokens and γ — for the presenter's page, its watchers and a replay of the run.

A real server with a step budget of 8 tokens, so a prompt of more than 8 tokens prefills in chunks and
the draft model catches up in chunks in round 1 (what kept "prefill 56 of 63 tokens" up for the whole run).
"""
from __future__ import annotations

import json
import re
import urllib.request

import websockets

from app.views.recording import Recording
from app.views.replay import replay_frames

from ws_client import run, ws_url
from test_ws_html import Fragments, HtmlClient, status_is

KEY = "status-line-presenter-key-0001"
PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
STATUS = re.compile(r'<div id="run-status".*?</div>', re.S)


def statuses(messages: list[Fragments]) -> list[dict]:
    """Every status line a client was sent: its attributes and its text."""
    out = []
    for f in messages:
        for html in STATUS.findall(f.raw):
            attrs = Fragments(html).top[0][1]
            out.append({**attrs, "text": " ".join(re.sub(r"<[^>]+>", " ", html).split())})
    return out


def check_truthful(shown: list[dict], progress_shown: bool = True) -> None:
    """Progress while prefilling, never once a round was reported; the round count once it has one. (A replay
    swaps a round's events in at once, the prefill's chunks with them: it shows no progress.)"""
    running = [s for s in shown if s.get("data-state") in ("running", "done")]
    assert any("data-prefill" in s for s in running) == progress_shown, shown
    for s in running:
        if "data-prefill" in s:
            done, total = map(int, s["data-prefill"].split("/"))
            assert done < total and "prefill" in s["text"] and "round" not in s["text"], s
        else:
            assert f"round {s['data-round']}" in s["text"] and "prefill" not in s["text"], s
    after = [s for s in running if int(s["data-round"]) >= 2]
    assert after and not any("data-prefill" in s for s in after), after     # the "round 50"
    assert "γ 4" in after[0]["text"], after[0]
    last = shown[-1]
    assert last["data-state"] == "done" and "data-prefill" not in last and "max tokens reached" in last["text"], last


def test_the_status_line_tells_the_truth_after_a_chunked_prefill_for_presenter_watcher_and_replay(live_server):
    from app.watch.rooms import watch_id_for

    async def scenario():
        async with websockets.connect(ws_url(live_server, f"/watch/{watch_id_for(KEY)}/ws"), max_size=2 ** 24,
                                      open_timeout=10) as wws, \
                websockets.connect(ws_url(live_server, f"/ws?key={KEY}"), max_size=2 ** 24, open_timeout=10) as pws:
            presenter, watcher = HtmlClient(pws), HtmlClient(wws)
            await presenter.until(lambda f: True)                                   # hello
            await presenter.send(action="toggle", prompt=PROMPT, model="target-mha", method="draft_model",
                                 num_speculative_tokens="4", max_tokens="40", speed="25",
                                 enable_prefix_caching=["false"])
            await presenter.until(status_is("done"))
            await watcher.until(status_is("done"))
            key = next(a["data-recording"] for _, a in presenter.elements(lambda t, a: a.get("id") == "stream")
                       if a.get("data-recording"))
            return statuses(presenter.messages), statuses(watcher.messages), key

    presenter, watcher, key = run(scenario())
    check_truthful(presenter)
    check_truthful(watcher)

    # the replay of that run: the same truth, frame by frame
    with urllib.request.urlopen(f"{live_server}/teach/recordings/{key}.json", timeout=10) as r:
        recording = Recording.from_json(json.loads(r.read()))
    assert any(e.type == "prefill_progress" and e.model == "draft" and e.num_computed == e.num_tokens
               for e in recording.events)                       # the engine says when the catch-up ends
    check_truthful(statuses([Fragments(f) for f in replay_frames(recording)]), progress_shown=False)


def test_a_recording_without_the_last_chunks_report_still_shows_rounds(live_server):
    """Recordings made before the engine reported a chunked prefill's end: the view leaves the progress behind
    at the first decoded token (the view of a watcher who joins late draws the run so far from such events)."""

    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), max_size=2 ** 24, open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", prompt=PROMPT, model="target-mha", method="draft_model",
                         max_tokens="24", speed="max", enable_prefix_caching=["false"])
            await c.until(status_is("done"))
            return next(a["data-recording"] for _, a in c.elements(lambda t, a: a.get("id") == "stream")
                        if a.get("data-recording"))

    key = run(scenario())
    with urllib.request.urlopen(f"{live_server}/teach/recordings/{key}.json", timeout=10) as r:
        data = json.loads(r.read())
    data["events"] = [e for e in data["events"]
                      if not (e["type"] == "prefill_progress" and e["num_computed"] == e["num_tokens"])]
    from app.protocol import Batch, RenderContext
    from app.views.html import HtmlView

    view, events = HtmlView(), Recording.from_json(data).events
    shown = []
    for i, e in enumerate(events):                    # one message per event: every state the view passes through
        shown += statuses([Fragments(f) for f in view.render([Batch(1, [e])], RenderContext(1, state="running"))])
    assert any("data-prefill" in s for s in shown)
    decoding = [s for s in shown if int(s["data-round"]) >= 1]
    assert decoding and not any("data-prefill" in s for s in decoding), decoding
    assert shown[-1]["data-state"] == "done" and "data-prefill" not in shown[-1]


def test_the_status_line_says_why_the_acceptance_schedule_turned_speculation_off():
    """The `acceptance` schedule's own report, in words: off, with its average, threshold and the next probe; then
    the probe; no words for a schedule that reports nothing (the web layer translates, the engine decides)."""
    from app.views.fragments import status_view
    from engine.spec_decode.schedule import OFF_ROUNDS, WARMUP_ROUNDS, AcceptanceSchedule

    schedule = AcceptanceSchedule(16)
    for _ in range(WARMUP_ROUNDS):
        schedule.observe(2, 0)

    def detail(schedule_state):
        return status_view({"state": "running", "round": 7, "tokens": 9, "gamma": schedule.k, "finish": None,
                            "schedule": schedule_state})["detail"]
    off = detail(schedule.report())
    assert off.startswith("round 7 · 9 tokens · γ 0 · speculation off: 0.00 draft tokens accepted a round")
    assert "at most 0.5" in off and f"a probe in {OFF_ROUNDS} rounds" in off
    for _ in range(OFF_ROUNDS):
        schedule.observe(0, 0)
    assert detail(schedule.report()).endswith("γ 1 (probing whether speculation pays again: 0.00 draft tokens "
                                              "accepted a round (moving average))")
    assert detail(None).endswith("γ 1")


def test_the_status_line_says_why_the_batch_schedule_turned_speculation_off():
    """The `batch` schedule's report in words: γ from the table at this load, off where the measured table found no
    speculation fastest (with where it was measured), and no table: γ as set."""
    from app.views.fragments import status_view
    from engine.spec_decode.batch_schedule import BatchSchedule, validated_table

    running = [1]
    schedule = BatchSchedule(6, {"table": validated_table([[1, 3, 4], [4, 15, 0]]), "measured": "bench serve --sweep"},
                             lambda: running[0])

    def detail():
        schedule.observe(0, 0)
        return status_view({"state": "running", "round": 3, "tokens": 5, "gamma": schedule.k, "finish": None,
                            "schedule": schedule.report()})["detail"]
    assert detail().endswith("γ 4 (by load: 1 session on this model, the table's γ for 1-3 sessions)")
    running[0] = 20
    off = detail()
    assert off.startswith("round 3 · 5 tokens · γ 0 · speculation off: 20 sessions on this model")
    assert "at 4 sessions or more the measured table (bench serve --sweep) found no speculation fastest" in off
    running[0] = 9
    assert "at 4-15 sessions the measured table" in detail()
    schedule = BatchSchedule(6, None, lambda: 2)
    assert detail().endswith("γ 6 (by load: no table measured for this model and method, γ as set; "
                             "2 sessions on this model)")
