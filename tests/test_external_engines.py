"""External engines through `/api/ws` on a real uvicorn server: a real llama.cpp server (xllamacpp, the
SmolLM2 GGUF), hostile OpenAI-compatible servers on loopback (tests/hostile_engine.py), and proof that no
client message makes the server connect to a URL the operator did not configure."""
from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import pytest
from hostile_engine import HostileEngine
from ws_client import connect, get_json, run, ws_url

from engine.external.llamacpp_server import LABEL, gguf_path, unavailable_reason

FAULTS = {   # scenario -> what the error says
    "bad-json": "an event is not JSON",
    "server-error": "HTTP 500",
    "html": "expected text/event-stream",
    "huge": "a line of the event stream is over",
    "stalls": "nothing received for 1 s (stall timeout)",
    "never-ends": "no end after 3 s (total timeout)",
}


@pytest.fixture(scope="module")
def hostile():
    with HostileEngine() as server:
        yield server


@pytest.fixture(scope="module")
def trap():
    """A server no one configured: it must never hear from us."""
    with HostileEngine() as server:
        yield server


@pytest.fixture(scope="module")
def app(models_dir, hostile):
    from app.config import AppConfig
    from app.main import create_app

    engines = tuple({"url": hostile.url(s), "name": f"hostile {s}", "stall_s": 1.0, "total_s": 3.0}
                    for s in ["ok", *FAULTS])
    # the same endless stream with a total timeout no test waits for: only a stop can end it soon
    engines += ({"url": hostile.url("never-ends"), "name": "hostile endless", "stall_s": 1.0, "total_s": 600.0},)
    return create_app(AppConfig(models_dir=models_dir, openai_engines=engines, embedded_llamacpp=True))


@pytest.fixture(scope="module")
def server(app):
    from live_server import serve

    with serve(app) as base_url:
        yield base_url


def test_configured_engines_are_in_the_model_list(server):
    models = {m["name"]: m for m in get_json(server + "/api/models")["models"]}
    assert models["hostile ok"]["external"] is True and models["hostile ok"]["engine"] == "openai"
    assert not any("127.0.0.1" in str(m) for m in models.values()), "a server URL leaked into the model list"


@pytest.mark.parametrize("scenario", list(FAULTS))
def test_a_faulty_engine_gives_an_error_in_time_and_the_connection_then_generates(server, scenario):
    async def scenario_run():
        async with connect(server) as c:
            t0 = time.monotonic()
            await c.send(type="start", prompt="Hi", settings={"model": f"hostile {scenario}", "max_tokens": 8})
            error = await c.until("error", "done", timeout=10)
            assert error["type"] == "error" and FAULTS[scenario] in error["message"], error
            assert time.monotonic() - t0 < 3.0 + 1.0 + 2.0
            await c.send(type="start", prompt="Hi", settings={"model": "hostile ok", "max_tokens": 8})
            done = await c.until("done", timeout=10)
            assert done["summary"]["text"] == "Hello, world"
    run(scenario_run())


def test_settings_an_external_engine_cannot_take_are_named(server):
    async def scenario():
        async with connect(server) as c:
            await c.send(type="start", prompt="Hi",
                         settings={"model": "hostile ok", "num_kv_heads": 1, "method": "ngram"})
            note = await c.until("settings_applied", timeout=10)
            assert note["notes"] == ["set by the server at start-up (hostile ok), not applied: num_kv_heads, method"]
            await c.until("done", timeout=10)
    run(scenario())


def test_no_client_message_makes_the_server_connect_to_an_unconfigured_url(server, trap):
    url = trap.url("ok")
    host = url.split("/")[2]
    attempts = [{"model": url}, {"model": host}, {"model": url + "/chat/completions"},
                {"url": url}, {"base_url": url}, {"openai_url": url}, {"metrics_url": url}, {"api_base": url}]

    async def scenario():
        async with connect(server) as c:
            for settings in attempts:
                await c.send(type="start", prompt="Hi", settings={**settings, "max_tokens": 2})
                reply = await c.until("error", "done", timeout=30)
                assert reply["type"] == "error", (settings, reply)
            await c.send(type="start", prompt="Hi", url=url, settings={"max_tokens": 2})
            await c.until("error", "done", timeout=30)
    run(scenario())
    for path in (f"/api/models?url={url}", f"/?model={url}", f"/api/stats?openai_url={url}"):
        try:
            urllib.request.urlopen(server + path, timeout=10).read()
        except OSError:
            pass
    assert trap.requests == []


# --- a real llama.cpp server, started by the app ------------------------------------------------------
@pytest.fixture(scope="module")
def llamacpp(server):
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! llama.cpp through /api/ws SKIPPED: {reason} !!!")
    models = {m["name"]: m for m in get_json(server + "/api/models")["models"]}
    assert LABEL in models, f"the app did not start llama.cpp (see its log): {sorted(models)}"
    return models[LABEL]


def _predicted_total(server_app_engine) -> float:
    import httpx
    text = httpx.get(server_app_engine.metrics_url, headers=server_app_engine.headers(), timeout=10).text
    return float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M).group(1))


def test_llamacpp_chat_reaches_done_through_api_ws_and_its_metrics_move(app, server, llamacpp):
    engine = app.state.playground.external[LABEL]
    assert llamacpp["threads"] == 1 and llamacpp["engine"] == "llamacpp"
    published = llamacpp["published"]                 # what llama.cpp says about itself (/props, /v1/models)
    assert published["model_ftype"] == "Q4_1" and published["n_ctx"] > 0 and published["models"] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert 0.9 * gguf_path().stat().st_size < published["size"] <= gguf_path().stat().st_size
    assert published["n_params"] == 134_515_008
    before = _predicted_total(engine)

    async def scenario():
        async with connect(server) as c:
            await c.send(type="start", prompt="Name three colours.", settings={"model": LABEL, "max_tokens": 10})
            started = await c.until("started", timeout=30)
            assert started["model"]["name"] == LABEL
            done = await c.until("done", timeout=120)
            tokens = [m for m in c.seen if m["type"] == "token"]
            return done, tokens
    done, tokens = run(scenario(), timeout=150)
    s = done["summary"]
    assert s["finish_reason"] == "length" and s["engine_usage"]["completion_tokens"] == 10
    assert "".join(t["text"] for t in tokens) == s["text"] and all(t["status"] == "target" for t in tokens)
    assert s["ttft_ms"] > 0 and s["tokens_per_s"] > 0 and s["engine_tokens_per_s"] > 0
    assert _predicted_total(engine) - before == 10
    assert s["server_metrics_moved"]["llamacpp:tokens_predicted_total"] == 10     # as the page reports it


def test_stop_closes_an_external_stream_at_once(server):
    async def scenario():
        async with connect(server) as c:
            await c.send(type="start", prompt="Hi", settings={"model": "hostile endless"})
            await c.until("token", timeout=60)
            await c.send(type="stop")
            done = await c.until("done", "error", timeout=60)  # its total timeout is 600 s: only the stop ends it
            assert done["type"] == "done" and done["summary"]["finish_reason"] == "cancelled", done
            assert done["summary"]["text"] == "Hi"
    run(scenario())


def test_the_page_view_streams_an_external_engine_and_names_what_it_cannot_apply(server):
    import websockets
    from test_ws_html import Fragments, form

    async def scenario():
        texts = []
        async with websockets.connect(ws_url(server, "/ws"), open_timeout=10) as ws:
            await asyncio.wait_for(ws.recv(), 10)
            await ws.send(json.dumps(form(action="toggle", model="hostile ok", max_tokens="8")))
            while "Done: end of text." not in "".join(texts[-2:]):
                texts.append(await asyncio.wait_for(ws.recv(), 10))
                await ws.send(json.dumps({"ack": len(texts) + 1}))
        return texts
    texts = run(scenario())
    html = "".join(texts)
    statuses = {a["data-token-status"] for t in texts for _, a in Fragments(t).all if "data-token-status" in a}
    assert statuses == {"target"}
    assert "hostile ok: an external engine (openai)" in html
    assert "set by the server at start-up (hostile ok), not applied: method, num_speculative_tokens" in html
    assert ">Hello<" in html


def test_llamacpp_ngram_speculation_reports_accepted_drafts_per_round(app, server, llamacpp):
    from engine.external.llamacpp_server import NGRAM_LABEL
    if NGRAM_LABEL not in app.state.playground.external:
        pytest.fail(f"the app started llama.cpp but not its n-gram variant: {sorted(app.state.playground.external)}")
    prompt = "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."

    async def scenario():
        async with connect(server) as c:
            await c.send(type="start", prompt=prompt, settings={"model": NGRAM_LABEL, "max_tokens": 24})
            done = await c.until("done", timeout=120)
            return done, [m for m in c.seen if m["type"] == "round"]
    done, rounds = run(scenario(), timeout=150)
    s = done["summary"]
    t = s["engine_timings"]
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], t
    assert sum(r["num_draft_tokens"] for r in rounds) == t["draft_n"] == s["num_draft_tokens"]
    assert sum(r["num_accepted"] for r in rounds) == t["draft_n_accepted"] == s["num_accepted_tokens"]
    assert s["acceptance_rate"] == pytest.approx(t["draft_n_accepted"] / t["draft_n"])


def test_an_external_engine_cannot_take_the_name_of_one_of_our_models(models_dir):
    from app.config import AppConfig
    from app.state import Playground

    playground = Playground.load(AppConfig(models_dir=models_dir))
    ours = next(iter(playground.registry.models))
    playground.config = AppConfig(models_dir=models_dir, openai_engines=(
        {"url": "http://127.0.0.1:9/v1", "name": ours}, {"url": "http://127.0.0.1:9/v1", "name": "free"}))

    async def scenario():
        await playground.start()
        await playground.stop()
    run(scenario())
    assert list(playground.external) == ["free"]
    assert sum(m["name"] == ours for m in playground.models()) == 1


def test_only_http_urls_are_accepted_from_the_operator(models_dir):
    from app.config import AppConfig
    with pytest.raises(ValueError, match="http:// or https://"):
        AppConfig(models_dir=models_dir, openai_engines=({"url": "file:///etc/passwd"},))


def test_a_race_of_engines_puts_llamacpp_beside_ours_with_the_bytes_each_reads(server, llamacpp):
    import httpx
    form = {"prompt": "Name three colours.", "model": "smollm2-135m", "max_tokens": "8", "temperature": "0",
            "race": "engine", "race_a": "numpy", "race_b": LABEL}
    page = httpx.get(server + "/?model=smollm2-135m&view=race&race=engine", timeout=30).text
    assert f'value="{LABEL}" data-setting="engine"' in page and "ignored race=" not in page
    html = httpx.post(server + "/teach/race", data=form, headers={"Origin": server}, timeout=120).text
    assert 'data-setting="engine"' in html, html[:2000]
    assert html.count('data-figure="weight_bytes_per_token"') == 2 and "the bytes predict" in html
    assert html.count('data-figure="gb_per_s"') == 2 and "error:" not in html


def test_a_race_of_engines_names_its_sides_and_survives_a_failing_server(server):
    import httpx
    form = {"prompt": "Hi", "max_tokens": "6", "race": "engine", "race_a": "numpy", "race_b": "no such engine"}
    html = httpx.post(server + "/teach/race", data=form, headers={"Origin": server}, timeout=60).text
    assert "side B one of the configured engines" in html and "hostile ok" in html
    html = httpx.post(server + "/teach/race", data={**form, "race_b": "hostile server-error"},
                      headers={"Origin": server}, timeout=60).text
    assert "error: hostile server-error: " in html and "HTTP 500" in html
    html = httpx.post(server + "/teach/race", data={**form, "race_b": "hostile ok"}, headers={"Origin": server},
                      timeout=60).text
    assert "does not publish its weight bytes" in html and "error:" not in html


def test_a_server_the_app_starts_says_in_the_selector_that_it_is_starting_or_failed():
    from app.views.model_options import external_state
    from engine.external.openai_stream import ExternalEngine

    def label(**state):
        return external_state(ExternalEngine("vLLM · x", "http://127.0.0.1:9/v1", description=state))
    assert label(state="starting", ready=False) == " (starting…)"
    assert label(state="failed", ready=False, error="boom") == " (failed)"
    assert label(state="ready", ready=True) == "" and label() == ""



# --- serve's terminal: our lines only ------------------------------------------------------------------
def test_serve_prints_no_line_of_llamacpps_own_and_says_where_its_log_is(models_dir, tmp_path):
    """`serve` as `make run` starts it (llama.cpp on by default), read until it answers and llama.cpp is up:
    every line on its stdout and stderr is one of ours (the structured `ts=... level=...` format); llama.cpp's
    own lines are in the log file our line names, under the cache folder."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! serve's quiet terminal with llama.cpp SKIPPED: {reason} !!!")
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / gguf_path().name).symlink_to(gguf_path())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": str(cache), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--models-dir", str(models_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, up = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if sum("its own output: " in ln for ln in lines) == 2 and any("serving on" in ln for ln in lines):
                up.set()
        up.set()                                        # it ended: the assertion below says how
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        up.wait(120)
        assert proc.poll() is None and sum("its own output: " in ln for ln in lines) == 2, \
            "serve did not say it serves with both llama.cpp servers within 120 s:\n" + "\n".join(lines)
        deadline = time.monotonic() + 60                # "serving on" comes before uvicorn binds the port
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    assert r.status == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not answer:\n" + "\n".join(lines)
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
    logs = sorted((cache / "logs").glob("llamacpp-*.log"))
    said = [ln.split("its own output: ", 1)[1].strip('"') for ln in lines if "its own output: " in ln]
    assert sorted(map(str, logs)) == sorted(said), (said, logs)
    theirs = {ln.strip() for log in logs for ln in log.read_text().splitlines() if ln.strip()}
    assert any(" srv " in ln and "load_model" in ln for ln in theirs), "llama.cpp's own lines are not in its log"
    assert not [ln for ln in lines if ln.strip() in theirs], "a line of llama.cpp's own reached the terminal"
    assert all(ln.startswith("ts=") for ln in lines if ln.strip()), "\n".join(ln for ln in lines if not ln.startswith("ts="))


def test_llamacpps_errors_reach_us_as_an_excerpt_of_its_log(tmp_path):
    """llama.cpp in its child process: a file it cannot load ends the start with its own words and where its log
    is; a server that dies while serving (killed here on purpose) is said to have died, with the same."""
    from engine.external.llamacpp_server import EmbeddedLlamaCpp

    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! llama.cpp's error excerpts SKIPPED: {reason} !!!")
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a GGUF file")
    with pytest.raises(RuntimeError, match=r"llama\.cpp exited with code 1 while starting: .*failed to load model.*"
                                           r"\(its log: .*logs/llamacpp-plain-1t\.log\)"):
        EmbeddedLlamaCpp.start(bad, cache=tmp_path)
    server = EmbeddedLlamaCpp.start(gguf_path(), cache=tmp_path)
    try:
        assert server.log_path.parent == tmp_path / "logs" and "load_model" in server.log_path.read_text()
        server.process.kill()
        said = []
        server.on_exit(lambda fmt, *args: said.append(fmt % args))
        assert len(said) == 1 and said[0].startswith(f"!!! {LABEL} exited with code -9: ")
        assert said[0].endswith(f"(its log: {server.log_path})") and "listening on" in said[0]   # its last lines
    finally:
        server.close()
    server.on_exit(lambda *_: pytest.fail("a server we closed is not said to have died"))


def test_the_panel_shows_an_external_engines_own_values_or_says_set_by_the_server(models_dir, tmp_path):
    """The settings panel's values for an engine the app starts: vLLM's n-gram server on SmolLM2 (its description
    as VllmServer makes it) gets SmolLM2's 3 KV heads, the chat template and its n-gram drafter; a server that says
    nothing of itself only the chat template (its chat endpoint applies it); every other control it sets is
    named, for static/playground.js to say "set by the server" in it."""
    from app.views.page import SERVER_SET_CONTROLS, server_set
    from engine.external.openai_stream import ExternalEngine
    from engine.external.vllm_server import VARIANTS, VllmServer
    from engine.model.fetched import is_fetched, model_dir
    from engine.serving.registry import ModelRegistry

    if not is_fetched("smollm2-135m"):
        pytest.skip("!!! SmolLM2-135M is not fetched (make fetch): the panel's KV heads for vLLM SKIPPED !!!")
    registry = ModelRegistry.from_dir(models_dir)
    vllm = VllmServer(VARIANTS["ngram"], tmp_path / "venv", model_dir("smollm2-135m"), tmp_path).engine
    external = {vllm.name: vllm, "elsewhere": ExternalEngine("elsewhere", "http://127.0.0.1:9/v1")}
    s = server_set(vllm.name, external, registry)
    assert s["values"] == {"f-num_kv_heads": "3 — GQA", "f-chat": True, "f-method": "n-gram lookup"}
    assert s["controls"] == list(SERVER_SET_CONTROLS) and "set by the server" in s["reason"]
    assert server_set("elsewhere", external, registry)["values"] == {"f-chat": True}
    assert server_set(registry.default_target().name, external, registry) == {"reason": "", "controls": [], "values": {}}
