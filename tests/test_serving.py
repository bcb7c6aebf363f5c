"""Serving a room: limits, admission, disconnects, fuzzing, idle timeouts (real uvicorn, `websockets`); what the
room shows its operator (metrics, stats, logs) is in tests/test_serving_observability.py.

Each fixture is a real server in a thread configured for what its tests need. Waits are bounded.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.parse
import urllib.request

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from ws_client import PROMPT, Client, connect, get_json, run, wait_for_stats, ws_url


def serve_with(models_dir, **config):
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    return serve(create_app(AppConfig(models_dir=models_dir, **config)))


@pytest.fixture(scope="module")
def room_server(models_dir):
    """Room for a workshop: 32 generations, 100 in line, no practical rate limit (the fuzz test sends fast)."""
    with serve_with(models_dir, max_sessions=32, max_queue=100, messages_per_s=1e6, message_burst=10 ** 6) as url:
        yield url


@pytest.fixture(scope="module")
def strict_server(models_dir):
    """One slot and no line; 20 messages a second; generations idle for 1 s are stopped."""
    with serve_with(models_dir, max_sessions=1, max_queue=0, messages_per_s=20, message_burst=20,
                    idle_timeout_s=1.0, max_connections=6) as url:
        yield url


def stats_settle(url, **expected):
    stats = wait_for_stats(url, lambda s: all(s[k] == v for k, v in expected.items()), timeout=20)
    assert all(stats[k] == v for k, v in expected.items()), stats
    return stats


# --- message limits: an error event, the connection stays usable ------------------------------------------------
@pytest.mark.parametrize("bad, needle", [
    (json.dumps({"type": "start", "prompt": "x" * 70_000}), "message too large"),   # over 64 KiB, under uvicorn's limit
    ("[" * 60_000, "nested too deeply"),
    (b"\xff\xfe not utf-8", "UTF-8"),
    (json.dumps({"type": "start", "prompt": PROMPT, "settings": {"max_tokens": 10 ** 6}}), "max_tokens"),
    (json.dumps({"type": "start", "prompt": PROMPT, "settings": {"top_p": 0}}), "top_p"),
    (json.dumps({"type": "start", "prompt": PROMPT, "settings": {"block_size": "sixteen"}}), "block_size"),
    (json.dumps({"type": "start", "prompt": PROMPT, "extra": 1}), "unknown field"),
])
def test_bad_messages_get_an_error_and_the_same_connection_then_generates(room_server, bad, needle):
    async def scenario():
        async with connect(room_server) as c:
            await c.ws.send(bad)
            error = await c.recv()
            assert error["type"] == "error" and needle.lower() in error["message"].lower(), error
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 8})
            assert (await c.until("done"))["num_output_tokens"] >= 1

    run(scenario())


def test_a_message_over_the_transport_limit_closes_with_1009(room_server):
    async def scenario():
        async with connect(room_server) as c:
            with pytest.raises(ConnectionClosed) as closed:     # uvicorn closes while the client may still send
                await c.ws.send("x" * (2 * 1024 * 1024))
                await c.recv()
            assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
        async with connect(room_server) as c:                  # and goes on serving
            await c.send(type="pause")
            assert (await c.recv())["type"] == "error"

    run(scenario())


def test_the_rate_limit_answers_with_an_error_and_a_flood_is_closed(strict_server):
    from app.ws.socket import FLOOD_CLOSE_AFTER, RATE_ERROR_EVERY_S

    async def scenario():
        async with connect(strict_server) as c:
            sent = time.monotonic()
            for _ in range(40):                                  # twice the burst, at once
                await c.send(type="pause")
            answered = 0
            while "rate limit" not in (m := await c.recv())["message"]:
                answered += 1                                    # "pause: no generation running"
            limited = time.monotonic()
            # the burst, and what refilled at 20 a second while the server took them (however slowly it ran)
            assert 20 <= answered <= 20 + 20 * (limited - sent) + 1, (answered, limited - sent)
            later = [m for m in await c.quiet(0.3) if "rate limit" in m["message"]]
            assert len(later) <= (time.monotonic() - limited) // RATE_ERROR_EVERY_S, later   # once a second at most
            await asyncio.sleep(1.1)                             # the bucket refills: usable again
            await c.send(type="pause")
            assert "no generation" in (await c.until("error"))["message"]
        async with connect(strict_server, max_queue=None) as c:
            for _ in range(FLOOD_CLOSE_AFTER + 200):            # far over the rate, without a pause
                await c.ws.send('{"type": "pause"}')
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await c.recv()
            assert closed.value.rcvd.code == 1008

    run(scenario())


def test_the_token_bucket_gives_its_burst_then_its_rate_on_the_times_it_is_given():
    from app.security import TokenBucket

    bucket = TokenBucket(rate=20, burst=20)
    assert [bucket.take(0.0) for _ in range(21)] == [True] * 20 + [False]     # the burst at once, then nothing
    assert bucket.take(0.049) is False and bucket.take(0.05) is True           # one more every 50 ms
    assert bucket.take(0.05) is False
    assert sum(bucket.take(10.0) for _ in range(30)) == 20                     # refilled up to the burst, no more


# --- admission: 1013 beyond the line, served once others finish ----------------------------------------------
def test_a_start_beyond_the_limit_is_refused_with_1013_and_served_once_others_finish(strict_server):
    async def scenario():
        async with connect(strict_server) as first:
            await first.send(type="start", prompt=PROMPT, settings={"max_tokens": 300}, speed=5)
            await first.until("started")
            async with connect(strict_server) as second:
                await second.send(type="start", prompt=PROMPT, settings={"max_tokens": 5})
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                assert closed.value.rcvd.code == 1013 and "busy" in closed.value.rcvd.reason
            await first.send(type="stop")
            await first.until("done")
        stats_settle(strict_server, sessions=0, kv_blocks_used=0)
        async with connect(strict_server) as again:               # the retry is served
            await again.send(type="start", prompt=PROMPT, settings={"max_tokens": 5})
            assert (await again.until("done"))["num_output_tokens"] >= 1

    run(scenario())


def test_connections_beyond_the_limit_are_closed_with_1013(strict_server):
    async def scenario():
        stats_settle(strict_server, connections=0, watchers=0)
        clients = [await websockets.connect(ws_url(strict_server), open_timeout=10) for _ in range(6)]
        try:
            async with connect(strict_server) as extra:
                with pytest.raises(ConnectionClosed) as closed:
                    await extra.recv()
                assert closed.value.rcvd.code == 1013
        finally:
            for ws in clients:
                await ws.close()

    run(scenario())


# --- idle sessions time out -----------------------------------------------------------------------------------
def test_a_paused_generation_nobody_touches_is_stopped_and_its_blocks_freed(strict_server):
    async def scenario():
        stats_settle(strict_server, sessions=0)
        async with connect(strict_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 200}, paused=True)
            await c.send(type="step")
            await c.until("metrics")
            assert get_json(strict_server + "/api/stats")["kv_blocks_used"] > 0
            note = await c.until("note", timeout=10)
            assert note["kind"] == "idle" and "idle timeout" in note["text"]
            done = await c.until("done")
            assert done["finish_reason"] == "cancelled"

    run(scenario())
    stats_settle(strict_server, sessions=0, kv_blocks_used=0)


# --- disconnects: 100 clients leave mid-stream --------------------------------------------------------------------
def test_100_clients_that_leave_mid_stream_leave_no_blocks_in_use(room_server):
    async def scenario():
        clients = [Client(await websockets.connect(ws_url(room_server), open_timeout=30)) for _ in range(100)]
        tokens = asyncio.Event()

        async def read(c: Client) -> None:             # clients read what they get, as pages do
            async for raw in c.ws:
                if raw.startswith('{"type":"token"'):
                    tokens.set()

        readers = [asyncio.create_task(read(c)) for c in clients]
        for i, c in enumerate(clients):
            await c.send(type="start", prompt=f"{PROMPT}{i}", settings={"max_tokens": 400}, speed="max")
        # the first 32 generate, the others wait in line; leave once generations are under way
        await asyncio.wait_for(tokens.wait(), 60)
        deadline = time.monotonic() + 20
        while True:                                      # every start has been validated and admitted or queued
            busy = get_json(room_server + "/api/stats")
            if busy["sessions"] + busy["waiting"] == 100 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert busy["sessions"] == 32 and busy["waiting"] == 68 and busy["kv_blocks_used"] > 0, busy
        for i, c in enumerate(clients):
            if i % 2:
                c.ws.transport.abort()                  # vanished (a closed laptop lid)
        await asyncio.gather(*(c.ws.close() for c in clients[::2]))
        for r in readers:
            r.cancel()

    run(scenario())
    stats = stats_settle(room_server, sessions=0, waiting=0, kv_blocks_used=0, connections=0)
    assert stats["kv_blocks_total"] > 0


# --- fuzz: 1,000 random messages ---------------------------------------------------------------------------------
def random_message(rng: random.Random) -> str | bytes:
    values = [None, True, False, 0, -1, 1, 3, 2 ** 40, 1.5, -0.5, 1e308, float("nan"), "", "x", "4", "max", "auto",
              "draft_model", "int8", [], [1], {}, {"a": 1}, "\u0000", "é" * 3]
    settings_names = ["max_tokens", "temperature", "top_p", "seed", "method", "num_speculative_tokens", "kv_cache",
                      "kv_cache_dtype", "num_kv_heads", "block_size", "enable_prefix_caching", "model", "chat",
                      "prompt_lookup_min", "prompt_lookup_max", "fault", "nonsense"]
    kind = rng.random()
    if kind < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    if kind < 0.10:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(0, 60)))
    if kind < 0.12:
        return "{" * rng.randrange(1, 5000)
    if kind < 0.13:
        return json.dumps({"type": "start", "prompt": "y" * rng.randrange(60_000, 90_000)})
    msg: dict = {"type": rng.choice(["start", "settings", "pause", "resume", "step", "stop", "reset", "speed",
                                     "dance", None, 7])}
    if rng.random() < 0.7:
        msg["prompt"] = rng.choice([PROMPT, "", "a", "\u0000\n", "z" * rng.randrange(0, 9000), None, 5])
    if rng.random() < 0.7:
        settings = {rng.choice(settings_names): rng.choice(values) for _ in range(rng.randrange(0, 5))}
        if msg["type"] == "start" and rng.random() < 0.5:        # often a valid, short generation
            settings = {"max_tokens": rng.randrange(1, 12), "num_speculative_tokens": rng.randrange(1, 7)}
        msg["settings"] = settings
    if rng.random() < 0.3:
        msg["speed"] = rng.choice(values + [5, 0.1, 1000, 2000])
    if rng.random() < 0.1:
        msg["paused"] = rng.choice(values)
    if rng.random() < 0.05:
        msg[rng.choice(["HEADERS", "ack", "extra"])] = rng.choice(values)
    return json.dumps(msg, allow_nan=True)


def test_1000_random_messages_leave_the_server_healthy(room_server):
    rng = random.Random(20240607)
    messages = [random_message(rng) for _ in range(1000)]

    async def scenario():
        async with connect(room_server) as c:
            types: dict[str, int] = {}
            marker = "end-of-the-fuzz"

            async def drain():           # until the answer to the marker: every message before it is answered
                async for raw in c.ws:
                    m = json.loads(raw)
                    types[m["type"]] = types.get(m["type"], 0) + 1
                    if m["type"] == "error" and marker in m["message"]:
                        return

            reader = asyncio.create_task(drain())
            for i, m in enumerate(messages):
                await c.ws.send(m)
                if i % 50 == 0:
                    await asyncio.sleep(0.01)
            await c.send(type="reset")                           # ends any run, and waits for it to end
            await c.send(type=marker)
            await asyncio.wait_for(reader, 60)
            assert types.get("error", 0) > 100, types
            # the same connection still works
            c.seen.clear()
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 10})
            assert (await c.until("done"))["num_output_tokens"] >= 1
        with urllib.request.urlopen(room_server + "/healthz", timeout=5) as r:
            assert json.loads(r.read()) == {"status": "ok"}
        async with connect(room_server) as fresh:
            await fresh.send(type="start", prompt=PROMPT, settings={"max_tokens": 10})
            assert (await fresh.until("done"))["num_output_tokens"] >= 1

    run(scenario())
    stats = stats_settle(room_server, sessions=0, waiting=0, kv_blocks_used=0)
    assert stats["engine"]["alive"]
