"""`/api/ws` and `/ws` against a real uvicorn server: which origins may open them, and a start beyond the
server's sessions waiting in line for a slot (the API's `queued`, the page's run status), and that line itself."""
from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from ws_client import PROMPT, connect, get_json, run, wait_for_stats, ws_url

from app.ws.admission import Admission, Busy


# --- origins -------------------------------------------------------------------------------------------------------
def test_cross_origin_handshake_is_refused_with_403(live_server):
    async def scenario():
        with pytest.raises(InvalidStatus) as refused:
            async with connect(live_server, origin="http://evil.example"):
                pass
        assert refused.value.response.status_code == 403
        for path in ("/ws", "/api/ws"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(live_server, path, origin="null"):
                    pass
            assert refused.value.response.status_code == 403

    run(scenario())


def test_own_origin_and_no_origin_are_accepted(live_server):
    async def scenario():
        async with connect(live_server, origin=live_server) as c:
            await c.send(type="pause")
            assert (await c.recv())["type"] == "error"       # accepted: it answers
        async with connect(live_server) as c:                # no Origin: not a browser
            await c.send(type="pause")
            assert (await c.recv())["type"] == "error"

    run(scenario())


@pytest.fixture(scope="module")
def small_server(models_dir):
    """A server with an extra allowed origin and room for one session only."""
    from live_server import serve

    from app.config import AppConfig
    from app.main import create_app

    config = AppConfig(models_dir=models_dir, allowed_origins=("https://slides.example",), max_sessions=1)
    with serve(create_app(config)) as base_url:
        yield base_url


def test_configured_origin_is_accepted_and_others_still_refused(small_server):
    async def scenario():
        async with connect(small_server, origin="https://slides.example") as c:
            await c.send(type="pause")
            assert (await c.recv())["type"] == "error"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(small_server, origin="https://slides.example.evil"):
                pass
        assert refused.value.response.status_code == 403

    run(scenario())


def test_a_start_beyond_the_limit_waits_in_line_and_is_served_after(small_server):
    """One slot: the second start is told its place in line, then starts by itself when the first ends."""
    async def scenario():
        async with connect(small_server) as first, connect(small_server) as second:
            await first.send(type="start", prompt=PROMPT, settings={"max_tokens": 300}, speed=5)
            await first.until("started")
            await second.send(type="start", prompt=PROMPT, settings={"max_tokens": 5})
            queued = await second.recv()
            assert (queued["type"], queued["position"], queued["max_sessions"]) == ("queued", 1, 1), queued
            assert get_json(small_server + "/api/stats")["waiting"] == 1
            assert [m["type"] for m in await second.quiet()] == []         # no slot: nothing runs
            await first.send(type="stop")
            await first.until("done")
            assert (await second.until("done"))["num_output_tokens"] >= 1

    run(scenario())
    stats = wait_for_stats(small_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0, stats


def test_the_page_shows_its_place_in_line_then_runs(small_server):
    """The htmx page's view of the line: run-status `queued` with the position, then the run."""
    from test_ws_html import form

    async def until_raw(ws, needle: str) -> str:
        async with asyncio.timeout(30):
            while needle not in (text := await ws.recv()):
                pass
        return text

    async def scenario():
        async with connect(small_server) as first, \
                websockets.connect(ws_url(small_server, "/ws"), open_timeout=10) as page:
            await page.recv()                                      # hello
            await first.send(type="start", prompt=PROMPT, settings={"max_tokens": 300}, speed=5)
            await first.until("started")
            await page.send(json.dumps(form(action="toggle", max_tokens="6")))
            waiting = await until_raw(page, 'data-state="queued"')
            assert "Waiting" in waiting and "number 1 in line" in waiting
            await first.send(type="stop")
            await first.until("done")
            await until_raw(page, 'data-state="done"')

    run(scenario())
    stats = wait_for_stats(small_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["waiting"] == 0, stats


# --- the admission line itself (app/ws/admission.py) ---------------------------------------------------------------
def test_admission_serves_in_order_tells_positions_and_refuses_beyond_the_line():
    async def scenario():
        adm = Admission(limit=1, max_queue=2)
        await adm.acquire()
        positions = {"b": [], "c": []}
        b = asyncio.create_task(adm.acquire(positions["b"].append))
        c = asyncio.create_task(adm.acquire(positions["c"].append))
        await asyncio.sleep(0)
        assert adm.waiting == 2 and positions == {"b": [1], "c": [2]}
        with pytest.raises(Busy):
            await adm.acquire()
        adm.release()                                   # the slot goes to b, not to a newcomer
        await b
        assert positions["c"] == [2, 1] and adm.running == 1
        c.cancel()                                      # c leaves the line
        with pytest.raises(asyncio.CancelledError):
            await c
        assert adm.waiting == 0
        adm.release()
        assert adm.running == 0 and adm.refused == 1

    run(scenario())


def test_a_waiter_cancelled_as_it_gets_the_slot_passes_it_on():
    async def scenario():
        adm = Admission(limit=1, max_queue=2)
        await adm.acquire()
        b = asyncio.create_task(adm.acquire())
        c = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        adm.release()                                   # b is granted ...
        b.cancel()                                      # ... and cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await b
        await c                                         # so c has the slot
        assert adm.running == 1 and adm.waiting == 0

    run(scenario())
