"""Serving a room: limits, admission, disconnects, fuzzing, idle timeouts, metrics (real uvicorn, `websockets`).

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


# --- observability ------------------------------------------------------------------------------------------------
def test_metrics_are_prometheus_text_with_vllm_names(room_server):
    async def scenario():
        async with connect(room_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 20, "num_speculative_tokens": 3})
            return await c.until("done")

    done = run(scenario())
    engine = get_json(room_server + "/api/stats")["engine"]
    assert engine["steps"] >= 1 and engine["posts"] >= 1          # this run's rounds reached the event loop
    with urllib.request.urlopen(room_server + "/metrics", timeout=5) as r:
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:generation_tokens_total",
                 "playground_kv_blocks_used", "playground_websocket_connections", "playground_watchers",
                 "playground_engine_posts_total"):
        assert name in text, name
    model = done["model"]["name"]
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{model}"}}' in text or \
        f'vllm:request_success_total{{model_name="{model}",finished_reason="length"}}' in text
    for line in text.splitlines():       # every sample line: name{labels} value
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            float(value.replace("+Inf", "inf"))
            assert name and " " not in name.split("{")[0]


def test_stats_report_sessions_watchers_and_blocks_per_pool(room_server):
    stats = get_json(room_server + "/api/stats")
    assert {"sessions", "waiting", "connections", "watchers", "kv_blocks_used", "kv_blocks_total", "pools",
            "max_sessions", "engine"} <= stats.keys()
    assert stats["max_sessions"] == 32 and stats["engine"]["alive"]
    for pool in stats["pools"]:
        assert {"name", "num_blocks", "used", "kv_cache_dtype", "block_size"} <= pool.keys()


def test_logs_never_contain_the_prompt(room_server, caplog):
    import logging

    secret = "def very_secret_prompt_text(x):"
    with caplog.at_level(logging.DEBUG):
        async def scenario():
            async with connect(room_server) as c:
                await c.send(type="start", prompt=secret, settings={"max_tokens": 5})
                await c.until("done")
        run(scenario())
    assert caplog.records and any(getattr(r, "fields", None) for r in caplog.records)
    assert all(secret not in r.getMessage() and secret not in json.dumps(getattr(r, "fields", {}), default=str)
               for r in caplog.records)


def test_the_log_formatter_and_the_query_redaction():
    import logging

    from app.logs import RedactQuery, StructuredFormatter

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/?prompt=secret&token=abc", "1.1", 200), None)
    RedactQuery().filter(record)
    line = StructuredFormatter().format(record)
    assert "secret" not in line and "abc" not in line and "GET /?…" in line
    event = logging.LogRecord("app.ws.connection", logging.INFO, __file__, 1, "generation_done", (), None)
    event.fields = {"session": "s1", "num_output_tokens": 5}
    assert json.loads(StructuredFormatter("json").format(event))["num_output_tokens"] == 5
    assert "event=generation_done session=s1 num_output_tokens=5" in StructuredFormatter().format(event)


# --- the load test command itself -------------------------------------------------------------------------------
def test_bench_serve_runs_real_clients_against_a_real_server(models_dir):
    import os
    import subprocess
    import sys

    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": os.devnull, "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "cli.main", "bench", "serve", "--clients", "3", "--watchers", "4",
                        "--repeats", "1", "--max-tokens", "12", "--models-dir", str(models_dir), "--json",
                        "--no-write"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["concurrent"]["clients"] == 3 and out["concurrent"]["errors"] == 0
    assert out["alone"]["tokens_per_s"] > 0 and out["ratio_to_alone"] > 0
    assert out["after_all_left"]["kv_blocks_used"] == 0
    assert out["watch"]["errors"] == 0 and out["watch"]["connected"] == 4
    engine_alone = out["engine_alone"]                   # the ceiling: the Scheduler in a loop, no server
    assert engine_alone["alone_tokens_per_s"] > 0 and engine_alone["concurrent_tokens_per_s"] > 0


def test_serve_says_what_it_exposes_and_logs_neither_prompts_nor_tokens(models_dir):
    """`decoding-playground serve` end to end: its startup lines, workshop mode, structured logs."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token, prompt = "serve-test-token-77", "def leaked_prompt_text("
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": os.devnull}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--models-dir",
                             str(models_dir), "--token", token, "--log-format", "json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        with urllib.request.urlopen(f"{base}/?token={token}&prompt={urllib.parse.quote(prompt)}", timeout=5) as r:
            assert r.status == 200

        async def scenario():
            async with connect(base, f"/api/ws?token={token}") as c:
                await c.send(type="start", prompt=prompt, settings={"max_tokens": 5})
                await c.until("done")
        run(scenario())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines, err
    serving = next(l for l in lines if l.get("msg", "").startswith("serving on"))
    assert "this machine only" in serving["msg"] and "at most 8 generating sessions" in serving["msg"]
    assert any("workshop mode" in l.get("msg", "") for l in lines)
    events = {l.get("event") for l in lines}
    assert {"generation_started", "generation_done"} <= events
    assert prompt not in err and urllib.parse.quote(prompt) not in err and token not in err
