"""The hostile-client probe's loose ends (issue 32, item 4), against a real server: what an error echoes of the
input (one rule: docs/protocol.md), a 4,301-digit integer's named error, the Host header parsed as RFC 9110 /
3986 say, and every bad `serve` option a one-line usage error."""
from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys

import pytest
import websockets

from ws_client import connect, run, ws_url
from test_ws_html import HtmlClient

LONG = "M" * 100            # repr: 102 characters


def excerpted(message: str) -> bool:
    """The rule: at most 40 characters of the value's repr, then "… (N characters)"."""
    return "M" * 40 not in message and "'" + "M" * 39 + "… (102 characters)" in message


# --- echoes --------------------------------------------------------------------------------------------------
API_ECHOES = {
    "model": {"type": "start", "prompt": "x", "settings": {"model": LONG}},
    "type": {"type": LONG},
    "unknown field": {"type": "start", "prompt": "x", LONG: 1},
    "unknown setting": {"type": "start", "prompt": "x", "settings": {LONG: 1}},
    "kv_cache_dtype": {"type": "start", "prompt": "x", "settings": {"kv_cache_dtype": LONG}},
    "method": {"type": "start", "prompt": "x", "settings": {"method": LONG}},
}


def test_api_errors_echo_a_40_character_excerpt_and_at_most_300_characters(live_server):
    async def scenario():
        got = {}
        async with connect(live_server) as c:
            for name, message in API_ECHOES.items():
                await c.send(**message)
                got[name] = (await c.until("error"))["message"]
        return got

    for name, message in run(scenario()).items():
        assert excerpted(message), (name, message)
        assert len(message) <= 300, (name, len(message))
    long = run(scenario())["unknown setting"]            # the known settings' list makes it longer than 300
    assert len(long) == 300 and long.endswith("…"), (len(long), long[-20:])


def html_error(c: HtmlClient) -> str:
    error = next(f for f in reversed(c.messages) if 'data-note="error"' in f.raw)
    return html.unescape(re.search(r'<div id="error"[^>]*>(.*?)</div>', error.raw, re.S).group(1))


@pytest.mark.parametrize("field", ["model", "kv_cache_dtype", "method", "action"])
def test_page_errors_echo_the_same_excerpt(live_server, field):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            fields = {"action": "toggle", field: LONG} if field != "action" else {"action": LONG}
            await c.send(**fields)
            await c.until(lambda f: 'data-note="error"' in f.raw)
            return html_error(c)

    message = run(scenario())
    assert excerpted(message) and len(message) <= 300, message


@pytest.mark.parametrize("path", ["/api/ws", "/ws"])
def test_a_4301_digit_integer_gets_an_error_naming_its_field_without_pythons_advice(live_server, path):
    text = '{"type": "start", "prompt": "x", "settings": {"max_tokens": ' + "9" * 4301 + "}}"
    if path == "/ws":
        text = '{"action": "toggle", "prompt": "x", "max_tokens": ' + "9" * 4301 + "}"

    async def scenario():
        async with websockets.connect(ws_url(live_server, path), open_timeout=10, max_size=2 ** 24) as ws:
            if path == "/ws":
                c = HtmlClient(ws)
                await c.until(lambda f: True)
                await ws.send(text)
                await c.until(lambda f: 'data-note="error"' in f.raw)
                return html_error(c)
            await ws.send(text)
            return json.loads(await ws.recv())

    got = run(scenario())
    message = got if isinstance(got, str) else got["message"]
    assert message.startswith("max_tokens: an integer of 4,301 digits"), message
    assert "sys." not in message and "set_int_max_str_digits" not in message, message
    if not isinstance(got, str):
        assert got["setting"] == "max_tokens"


# --- the Host header ---------------------------------------------------------------------------------------------
def raw_status(base: str, hosts: list[str], upgrade: bool = False) -> int:
    """The status line's code for a request with exactly these Host headers (http.client cannot send two)."""
    host, port = base.removeprefix("http://").split(":")
    lines = ["GET /api/ws HTTP/1.1" if upgrade else "GET /healthz HTTP/1.1", *(f"Host: {h}" for h in hosts)]
    if upgrade:
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        return int(s.recv(200).split(b" ", 2)[1])


@pytest.mark.parametrize("upgrade", [False, True])
def test_host_headers_are_parsed_as_the_rfcs_say(live_server, upgrade):
    port = live_server.rsplit(":", 1)[1]
    ok = 101 if upgrade else 200
    refused = {
        "userinfo": [f"127.0.0.1:{port}@evil.example"],
        "a port that is not a number": ["localhost:abc"],
        "a port beyond 65535": ["localhost:70000"],
        "a second Host header": [f"127.0.0.1:{port}", "evil.example"],
        "the same Host header twice": [f"127.0.0.1:{port}", f"127.0.0.1:{port}"],
        "an IPv6 literal that is not one": ["[::1x]:80"],
        "empty": [""],
    }
    for what, hosts in refused.items():
        assert raw_status(live_server, hosts, upgrade) == 400, what
    for host in (f"localhost:{port}", f"localhost.:{port}", "localhost.", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert raw_status(live_server, [host], upgrade) == ok, host


def test_a_trailing_dot_is_the_same_name_for_local_and_allowed_names_and_the_bind_address():
    from app.security import HostMiddleware

    for rule in (HostMiddleware(None, ("foo.example",), "127.0.0.1"), HostMiddleware(None, ("foo.example.",), "myhost")):
        for name in ("foo.example", "foo.example.", "FOO.example.:8000", "localhost.", "localhost.:8000"):
            assert rule.allows(name), name
        for name in ("foo.example..", "evil.example.", "foo.example:8000@evil.example", "foo.example:-1"):
            assert not rule.allows(name), name
    assert HostMiddleware(None, (), "myhost.").allows("myhost:80")
    assert not HostMiddleware(None, ("*",), "127.0.0.1").allows("a@b")       # any name, but a well-formed one


# --- serve's options ---------------------------------------------------------------------------------------------
BAD_SERVE_OPTIONS = [
    ["--max-num-batched-tokens", "-1"], ["--max-num-batched-tokens", "x"], ["--port", "70000"], ["--port", "-1"],
    ["--max-sessions", "0"], ["--max-connections", "-5"], ["--max-queue", "-1"], ["--idle-timeout", "nan"],
    ["--idle-timeout", "0"], ["--llamacpp-threads", "0"], ["--log-format", "xml"], ["--allowed-origin", "garbage"],
    ["--allowed-host", "a@b"], ["--allowed-host", "x:y:z"], ["--host", "999.1.1.1"], ["--models-dir", "/nonexistent"],
    ["--token", "short"], ["--frame-ancestors", "a;b"], ["--openai-url", "ftp://x"], ["--openai-model", "m"],
    ["--no-such-option"], ["--port"], ["--kv-cache-memory", "lots"], ["--kv-cache-memory", "0"],
    ["--kv-cache-memory", "-1GiB"], ["--kv-cache-memory", "12 parsecs"],
]


@pytest.mark.parametrize("argv", BAD_SERVE_OPTIONS, ids=lambda a: " ".join(a))
def test_every_bad_serve_option_is_a_one_line_usage_error(argv, capsys, monkeypatch):
    from cli.main import main

    monkeypatch.delenv("DECODING_PLAYGROUND_MODELS_DIR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith("decoding-playground serve: error: "), err


@pytest.mark.parametrize("env", [{"DECODING_PLAYGROUND_MAX_SESSIONS": "abc"}, {"DECODING_PLAYGROUND_MAX_SESSIONS": "0"},
                                 {"DECODING_PLAYGROUND_MODELS_DIR": "/nonexistent"},
                                 {"DECODING_PLAYGROUND_KV_CACHE_MEMORY": "1 byte"}])
def test_a_bad_environment_variable_is_one_line_too(env, capsys, monkeypatch):
    from cli.main import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main(["serve"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and next(iter(env)) in err, err


def test_the_issues_serve_option_in_a_real_process_ends_without_a_traceback():
    r = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--max-num-batched-tokens", "-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "--max-num-batched-tokens" in r.stderr and "at least 0" in r.stderr
