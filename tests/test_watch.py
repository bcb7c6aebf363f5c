"""Watch mode and workshop mode against real servers: watchers see the presenter's events, late watchers get
the run so far, a presenter's reconnect keeps its watchers; the token guards page, API and websockets."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

import pytest
import websockets
from test_serving import serve_with, stats_settle
from ws_client import PROMPT, Client, connect, get_json, run, ws_url
from websockets.exceptions import InvalidStatus

KEY = "a-presenter-key-for-tests-0001"


@pytest.fixture(scope="module")
def server(models_dir):
    with serve_with(models_dir, max_sessions=4) as url:
        yield url


def watch_id(key: str = KEY) -> str:
    from app.watch.rooms import watch_id_for
    return watch_id_for(key)


async def json_watcher(base: str, wid: str) -> Client:
    return Client(await websockets.connect(ws_url(base, f"/api/watch/{wid}"), max_size=2 ** 22, open_timeout=10))


def test_json_watchers_see_the_presenters_events_and_cost_no_engine_work(server):
    async def scenario():
        watchers = [await json_watcher(server, watch_id()) for _ in range(5)]
        for w in watchers:
            hello = await w.recv()
            assert hello == {"type": "watching", "watch_id": watch_id(), "presenter": False}
        async with connect(server, f"/api/ws?key={KEY}") as presenter:
            await presenter.send(type="start", prompt=PROMPT, settings={"max_tokens": 30, "num_speculative_tokens": 3})
            started = await presenter.until("started")
            assert started["watch_id"] == watch_id()
            done = await presenter.until("done")
            stats = get_json(server + "/api/stats")
            assert stats["watchers"] == 5 and stats["connections"] == 1
            for w in watchers:
                got = await w.until("done")
                assert got["text"] == done["text"]
                tokens = [m for m in w.seen if m["type"] == "token" and m["status"] != "rejected"]
                assert "".join(t["text"] for t in tokens) == done["text"]     # every token, in order
                # (a prompt over the engine's step budget prefills in chunks: prefill_progress events between)
                engine_events = [m["type"] for m in w.seen
                                 if m["type"] not in ("watching", "note", "state", "prefill_progress")]
                assert engine_events[:2] == ["started", "prefill"] and engine_events[-1] == "done"
            # watchers are read-only
            await watchers[0].send(type="start", prompt="x")
            assert "read-only" in (await watchers[0].until("error"))["message"]
        for w in watchers:
            await w.ws.close()

    run(scenario())
    stats_settle(server, watchers=0, sessions=0, kv_blocks_used=0)


def test_a_late_watcher_gets_the_run_so_far_then_follows_it(server):
    key = "late-watcher-presenter-key-02"

    async def scenario():
        async with connect(server, f"/api/ws?key={key}") as presenter:
            await presenter.send(type="start", prompt=PROMPT, settings={"max_tokens": 60}, paused=True)
            for _ in range(4):
                await presenter.send(type="step")
                await presenter.until("metrics")
            w = await json_watcher(server, watch_id(key))
            assert (await w.recv())["type"] == "watching"
            snapshot_started = await w.until("started")
            assert snapshot_started["watch_id"] == watch_id(key)
            await w.until("metrics")
            already = [m for m in w.seen if m["type"] == "token" and m["status"] != "rejected"]
            assert already                                   # the tokens of the rounds before it came
            await presenter.send(type="resume")
            done = await presenter.until("done")
            await w.until("done")
            tokens = [m for m in w.seen if m["type"] == "token" and m["status"] != "rejected"]
            assert "".join(t["text"] for t in tokens) == done["text"]
            await w.ws.close()

    run(scenario())


def test_a_presenter_back_while_its_old_socket_is_still_closing_takes_the_room():
    """The same key can come back while the old connection's tasks have ended (its task group is gone) but it
    is still giving back its run: the new connection presents, the old one is detached and not closed a
    second time, and its late leave does not empty the room. (Starting the close in the ended task group
    raised and lost the new connection.)"""
    from types import SimpleNamespace

    from app.watch.rooms import Rooms
    from app.ws.socket import Socket
    rooms = Rooms(make_view=lambda kind: None)
    old = SimpleNamespace(socket=Socket(None), room=None, watch_id=None)   # a Connection past its task group
    rooms.join_presenter(old, "k")
    new = SimpleNamespace(socket=Socket(None), room=None, watch_id=None)
    room = rooms.join_presenter(new, "k")
    assert room.presenter is new and new.room is room and old.room is None
    rooms.leave_presenter(old)                                     # its `finally`, late
    assert room.presenter is new and rooms.rooms[room.watch_id] is room


def test_html_watchers_get_fragments_and_keep_following_a_presenter_who_reconnects(server):
    key = "html-watchers-presenter-key-3"

    async def scenario():
        async with websockets.connect(ws_url(server, f"/watch/{watch_id(key)}/ws"), open_timeout=10) as w:
            first = await asyncio.wait_for(w.recv(), 10)
            assert 'id="conn"' in first                       # the page's connection indicator
            for run_number in range(2):                      # the presenter leaves and comes back in between
                async with connect(server, f"/ws?key={key}") as presenter:
                    await presenter.ws.recv()                 # hello
                    await presenter.ws.send(json.dumps({"action": "toggle", "prompt": PROMPT, "max_tokens": "12",
                                                        "speed": "max"}))
                    seen = ""
                    while not re.search(r'id="run-status"[^>]*data-state="done"', seen):
                        seen += await asyncio.wait_for(w.recv(), 20)
                    assert 'data-token-status=' in seen and 'hx-swap-oob' in seen
            await w.send(json.dumps({"ack": 3}))             # the page's acknowledgements are fine
            await w.send(json.dumps({"action": "toggle"}))   # anything else: read-only
            seen = ""
            while "read-only" not in seen:
                seen += await asyncio.wait_for(w.recv(), 10)

    run(scenario())


def test_a_watchers_view_redraws_the_status_for_a_run_that_ends_as_the_one_before(models_dir):
    """A broadcaster at full speed renders a short run in one message; two equal runs in a row must still each
    end with the status `done` of their own run (the CI once waited forever for the second)."""
    from fastapi.testclient import TestClient

    from app.config import AppConfig
    from app.main import create_app
    from app.protocol import Batch, RenderContext
    from engine.serving.session import GenerationSession

    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")),
                    base_url="http://localhost") as client:
        playground = client.app.state.playground
        view = playground.view("html")
        statuses = []
        for run_id in (1, 2):
            events = list(GenerationSession(playground.engine, PROMPT, {"max_tokens": 12}).events())
            (message,) = view.render([Batch(run_id, events)], RenderContext(run_id, state="running"))
            statuses.append(re.search(r'<div id="run-status"[^>]*>', message).group(0))
    assert all('data-state="done"' in s for s in statuses)
    assert 'data-run="1"' in statuses[0] and 'data-run="2"' in statuses[1]


def test_the_watch_page_is_read_only_and_points_at_its_websocket(server):
    with urllib.request.urlopen(f"{server}/watch/{watch_id()}", timeout=5) as r:
        html = r.read().decode()
    assert f'ws-connect="/watch/{watch_id()}/ws"' in html
    assert re.search(r'data-part="controls" hidden', html)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server}/watch/not-a-watch-id", timeout=5)
    assert e.value.code == 404


def test_the_page_links_its_watchers_to_its_own_session(server):
    with urllib.request.urlopen(server + "/", timeout=5) as r:
        html = r.read().decode()
    key = re.search(r'ws-connect="/ws\?key=([A-Za-z0-9_-]+)"', html).group(1)
    assert f'href="/watch/{watch_id(key)}"' in html


def test_a_bad_presenter_key_is_refused(server):
    async def scenario():
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server, "/api/ws?key=short"):
                pass
        assert refused.value.response.status_code == 403

    run(scenario())


# --- workshop mode ---------------------------------------------------------------------------------------------
TOKEN = "workshop-secret-42"


@pytest.fixture(scope="module")
def token_server(models_dir):
    with serve_with(models_dir, token=TOKEN) as url:
        yield url


def status_of(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_workshop_mode_guards_page_api_metrics_and_websockets(token_server):
    for path in ("/", "/embed", "/api/stats", "/api/models", "/metrics", f"/watch/{watch_id()}"):
        assert status_of(token_server + path) == 401, path
        assert status_of(f"{token_server}{path}{'&' if '?' in path else '?'}token=wrong-token-123") == 401, path
        assert status_of(f"{token_server}{path}?token={TOKEN}") == 200, path
    assert status_of(token_server + "/api/stats", {"Authorization": f"Bearer {TOKEN}"}) == 200
    assert status_of(token_server + "/healthz") == 200                      # Docker's health check
    assert status_of(token_server + "/static/app.css") == 200

    async def scenario():
        for path in ("/api/ws", "/ws", f"/api/watch/{watch_id()}"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(token_server, path):
                    pass
            assert refused.value.response.status_code == 403
        async with connect(token_server, f"/api/ws?token={TOKEN}") as c:
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 5})
            assert (await c.until("done"))["num_output_tokens"] >= 1
        async with connect(token_server, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            await c.send(type="pause")
            assert (await c.recv())["type"] == "error"

    run(scenario())


def test_the_workshop_page_carries_the_token_in_its_own_links(token_server):
    with urllib.request.urlopen(f"{token_server}/?token={TOKEN}", timeout=5) as r:
        html = r.read().decode()
        assert r.headers["referrer-policy"] == "no-referrer"
    ws = re.search(r'ws-connect="([^"]+)"', html).group(1).replace("&amp;", "&")
    assert f"token={TOKEN}" in ws
    watch = re.search(r'id="watch-link"', html) and re.search(r'href="(/watch/[^"]+)" id="watch-link"', html)
    assert watch is None or f"token={TOKEN}" in watch.group(1)
    assert re.search(rf'href="/watch/[0-9a-f]{{16}}\?token={TOKEN}"', html)

    async def scenario():
        async with websockets.connect(ws_url(token_server, ws), open_timeout=10) as page_ws:
            assert 'id="conn"' in await asyncio.wait_for(page_ws.recv(), 10)

    run(scenario())
