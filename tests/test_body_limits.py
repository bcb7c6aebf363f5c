"""Every HTTP body is bounded before it is read (app/body_limits.py): a body over its route's limit is refused at
once with 413 naming the limit, a chunked one is cut where it passes the limit, and none costs the server more
than the limit.

The hostile cases run against a real uvicorn server in its own process, whose memory is read from
/proc/PID/status: a 400 MB body made on the fly, streamed as fast as the socket takes it."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cli.bench.faults_bodies import HOSTILE_BYTES, LIMITS, MiB, memory, post_streamed, reset_peak

PROJECT_DIR = Path(__file__).resolve().parent.parent
REFUSED_WITHIN_S = 1.0              # from the request's first byte to the 413's status line
RSS_COST_BYTES = 64 * MiB           # the server's peak resident memory above where it was before the request


# --- the middleware alone (ASGI messages, no server) ---------------------------------------------------------
def call(path: str, body_chunks: list[bytes], content_length: int | None = None):
    """The app behind BodyLimitMiddleware reads its whole body; what it got, and what the client got."""
    from app.body_limits import BodyLimitMiddleware

    got: list[int] = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            got.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})

    chunks = list(body_chunks)
    sent: list[dict] = []

    async def receive():
        body = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    with concurrent.futures.ThreadPoolExecutor(1) as own_thread:     # a browser test's loop may run in this one
        own_thread.submit(asyncio.run, BodyLimitMiddleware(app)(scope, receive, send)).result()
    return sum(got), sent


def answer(sent: list[dict]) -> tuple[int, dict, dict]:
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), json.loads(body) if start["status"] == 413 else body


def test_a_chunked_body_is_cut_at_its_routes_limit_and_the_route_never_sees_more():
    read, sent = call("/teach/race", [b"x" * 16 * 1024] * 64)             # 1 MiB against 64 KiB
    status, headers, body = answer(sent)
    assert status == 413 and body == {"error": "request body too large: POST /teach/race takes at most 64 KiB"}
    assert read <= 64 * 1024                                              # the message that passes it is withheld
    assert headers[b"connection"] == b"close"                             # uvicorn would read the rest otherwise


def test_a_declared_length_over_the_limit_is_refused_before_anything_is_read():
    read, sent = call("/teach/replays", [b"{}"], content_length=32 * MiB + 1)
    assert read == 0 and answer(sent)[0] == 413 and "at most 32 MiB" in answer(sent)[2]["error"]


def test_a_body_within_its_limit_reaches_the_route_whole():
    read, sent = call("/teach/race", [b"x" * 1024] * 64)                  # exactly 64 KiB
    assert read == 64 * 1024 and answer(sent)[:1] == (200,)
    read, sent = call("/teach/replays", [b"x" * MiB] * 3, content_length=3 * MiB)
    assert read == 3 * MiB and answer(sent)[0] == 200


def test_every_route_that_takes_a_body_has_its_limit_listed(models_dir):
    from app.body_limits import BODY_LIMITS, human_bytes
    from app.config import AppConfig
    from app.main import create_app

    schema = create_app(AppConfig(models_dir=models_dir, demo="character")).openapi()     # every route, with methods
    taking = {(m.upper(), path) for path, methods in schema["paths"].items() for m in methods if m != "get"}
    assert taking and taking == set(BODY_LIMITS)
    protocol = (PROJECT_DIR / "docs" / "protocol.md").read_text()
    for (method, path), limit in BODY_LIMITS.items():                     # docs/protocol.md's table says the same
        assert f"| `{method} {path}` | {human_bytes(limit)} |" in protocol


# --- a real server in its own process --------------------------------------------------------------------------
SERVER = """
import sys, uvicorn
from app.config import AppConfig
from app.main import create_app
uvicorn.run(create_app(AppConfig(models_dir=sys.argv[1], demo="character")), fd=int(sys.argv[2]), log_level="error")
"""


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    """(base URL, pid) of `uvicorn` serving the app in a process of its own; no fetched model (its background
    load would move the memory measured)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1",
           "DECODING_PLAYGROUND_CACHE": str(tmp_path_factory.mktemp("no-fetched-models"))}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(models_dir), str(sock.fileno())], cwd=PROJECT_DIR,
                            env=env, pass_fds=[sock.fileno()])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        sock.close()


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("path", list(LIMITS))
def test_a_400_mb_body_is_refused_within_a_second_and_costs_the_server_under_64_mb(server, path, chunked):
    base, pid = server
    before = memory(pid)["VmRSS"]
    reset_peak(pid)
    r = post_streamed(base, path, HOSTILE_BYTES, chunked)
    peak = memory(pid)["VmHWM"]
    assert r["s"] < REFUSED_WITHIN_S and peak - before < RSS_COST_BYTES, (r["s"], (peak - before) / MiB, r["status"])
    assert r["status"] == 413 and r["json"]
    assert r["json"]["error"] == f"request body too large: POST {path} takes at most {LIMITS[path]}"
    assert r["connection"] == b"close"
    assert r["sent"] < HOSTILE_BYTES / 4                 # the rest was never taken: the connection was closed
    with urllib.request.urlopen(base + "/healthz", timeout=5) as ok:              # and the server serves on
        assert ok.status == 200
