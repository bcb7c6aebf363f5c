"""A room that cannot be stalled (issue 19): a client that never reads, bad form values, a fuzzed page form, a
long prefill beside a bystander, foreign Host names. Real uvicorn on loopback, raw sockets and `websockets`
clients; every wait is bounded. The scenarios are those of `decoding-playground bench faults` (cli/bench/faults.py),
which records their figures in docs/benchmarks.md; here they must stay within the issue's bounds.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time

import pytest
import websockets
from ws_client import PROMPT, connect, get_json, run, ws_url
from test_ws_html import HtmlClient, form, status_is

from cli.bench.faults import SUMMARY, TOKEN, Server, fuzz_forms, long_prompt, stuck_client

RELEASE_BOUND_S = 10.0          # the bound: after the 1008 decision, and for SIGTERM


def test_a_client_that_never_reads_is_closed_its_slot_given_on_and_sigterm_still_ends_the_server(models_dir):
    """`--max-sessions 1`: a raw socket with a 4 KiB receive buffer starts a generation, never reads and keeps
    sending `speed`; once the server decides 1008, its session, blocks and connection go within 10 s, the client
    queued behind it starts, and SIGTERM ends the server within 10 s while it (and a second never-reading
    client, held mid-generation) are still open."""
    r = run(stuck_client(str(models_dir)), timeout=240)
    assert r["freed_s"] is not None and r["freed_s"] <= RELEASE_BOUND_S, r
    assert r["gone_s"] is not None and r["gone_s"] <= RELEASE_BOUND_S, r
    assert r["queued_started_s"] <= RELEASE_BOUND_S, r
    assert r["shutdown_s"] is not None and r["shutdown_s"] <= RELEASE_BOUND_S, r


# --- bad values: a named error, the connection stays open, the next generation delivers every round --------------
async def html_run_delivers_every_token(c: HtmlClient, max_tokens: int = 24) -> None:
    """A generation on this /ws connection: every output token is shown (counted against the summary)."""
    await c.send(action="reset")
    await c.until(status_is("idle"))
    start = len(c.messages)
    await c.send(action="toggle", max_tokens=str(max_tokens), speed="max")
    done = await c.until(status_is("done"))
    texts = [f.raw for f in c.messages[start:]]
    shown = sum(s != "rejected" for text in texts for s in TOKEN.findall(text))
    summary = SUMMARY.search("".join(texts))
    assert done and summary and int(summary.group(1)) == shown, (summary and summary.group(0), shown)


@pytest.mark.parametrize("bad, needle", [
    ({"seed": "\ud800"}, "seed: not valid text"),
    ({"model": "\ud800"}, "model: not valid text"),
    ({"model": {"a": 1}}, "model: expected a text value"),
    ({"model": [[1]]}, "model: expected a text value"),
    ({"num_kv_heads": [[1]]}, "num_kv_heads: expected a text value"),
    ({"action": []}, "action: expected a text value"),
])
def test_a_bad_form_value_during_a_run_gets_a_named_error_and_loses_no_round(live_server, bad, needle):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)                                       # hello
            await c.send(action="toggle", max_tokens="200", speed="2")
            await c.until(lambda f: 'class="tok"' in f.raw)                    # a token: the run is on
            await ws.send(json.dumps({**form(max_tokens="200", speed="2"), **bad}))
            error = await c.until(lambda f: 'data-note="error"' in f.raw, timeout=20)
            assert needle in error.raw and "internal error" not in error.raw, error.raw[-400:]
            await html_run_delivers_every_token(c)

    run(scenario())


@pytest.mark.parametrize("bad, needle", [
    ('{"type": "start", "prompt": "\\ud800"}', "prompt: not valid text"),
    ('{"type": "start", "prompt": "x", "settings": {"max_tokens": ' + "9" * 4400 + "}}", "max_tokens: an integer of 4,400 digits"),
    ('{"type": "speed", "speed": "' + "x" * 65_000 + '"}', "speed: rounds per second"),
])
def test_bad_api_messages_get_named_errors_with_short_echoes(live_server, bad, needle):
    async def scenario():
        async with connect(live_server) as c:
            await c.ws.send(bad)
            error = await c.until("error")
            assert needle in error["message"] and "internal error" not in error["message"], error
            assert len(error["message"]) <= 300, len(error["message"])               # an excerpt, not the input
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 24})
            tokens = 0
            while (m := await c.recv())["type"] != "done":
                tokens += m["type"] == "token" and m["status"] != "rejected"
            assert tokens == m["num_output_tokens"] >= 1

    run(scenario())


def test_300_fuzzed_forms_are_each_answered_and_no_round_is_lost(live_server):
    counts = run(fuzz_forms(live_server, 300), timeout=300)
    assert counts["answered"] == 300, counts
    assert counts["errors"] >= 50 and counts["runs_checked"] >= 1, counts
    assert counts["tokens_lost"] == 0 and counts["runs_short"] == 0, counts
    stats = get_json(live_server + "/api/stats")
    assert stats["engine"]["alive"]


# --- chunked prefill ----------------------------------------------------------------------------------------------
def test_a_long_prefill_runs_in_chunks_and_a_bystander_gets_its_first_token_after_one_of_them(models_dir):
    """A SmolLM2 chat prompt of ~1,900 tokens (our own target near its context when SmolLM2 is not fetched)
    prefills in chunks: `started` comes at once, `prefill_progress` per chunk, and a bystander starting on our own
    target meanwhile gets its first token after at most one more chunk of it (and one reported late: the two
    sockets are read side by side), long before the prefill ends. The time that takes is a chunk's, whatever the
    machine's load: `bench faults` measures it on a quiet machine against the issue's 500 ms (docs/benchmarks.md).
    The same output as a whole prefill: tests/engine/test_scheduler.py, tests/smollm2/test_smollm2_generation.py."""
    with Server("--max-sessions", "4", models_dir=str(models_dir)) as srv:
        async def scenario():
            models = await asyncio.to_thread(get_json, srv.base + "/api/models")
            deadline = time.monotonic() + 600                       # SmolLM2's weights load in the background
            while any(m.get("loading") for m in models["models"]):
                assert time.monotonic() < deadline, "the models did not load within 600 s"
                await asyncio.sleep(0.2)
                models = await asyncio.to_thread(get_json, srv.base + "/api/models")
            settings, prompt = long_prompt(models["models"])
            async with connect(srv.base) as long, connect(srv.base) as bystander:
                await long.send(type="start", prompt=prompt, settings={**settings, "max_tokens": 2})
                started = await long.until("started", timeout=60)
                chunks = [await long.until("prefill_progress", timeout=60)]

                async def follow_long() -> None:       # every chunk reported, as it arrives
                    while chunks[-1]["num_computed"] < chunks[-1]["num_tokens"]:
                        chunks.append(await long.until("prefill_progress", timeout=120))

                follower = asyncio.create_task(follow_long())
                asked, chunks_before = time.monotonic(), len(chunks)
                await bystander.send(type="start", prompt=PROMPT, settings={"max_tokens": 4})
                await bystander.until("token", timeout=120)
                ttft, waited = time.monotonic() - asked, chunks[chunks_before - 1:]
                follower.cancel()
                await long.send(type="reset")                   # the rest of the prefill is not needed here
                return started, chunks, waited, ttft

        started, chunks, waited, ttft = run(scenario(), timeout=900)
    prompt_tokens = len(started["prompt_tokens"])
    assert prompt_tokens >= 400 and chunks[0]["num_tokens"] == prompt_tokens > chunks[0]["num_computed"] > 0
    assert [c["num_computed"] for c in chunks] == sorted({c["num_computed"] for c in chunks}), chunks
    # the chunk under way when it asked, at most one more and one reported late; far from the end of the prefill
    assert len(waited) <= 3, (ttft, [c["num_computed"] for c in waited])
    assert waited[-1]["num_computed"] < prompt_tokens / 2, (ttft, waited[-1], prompt_tokens)


def test_serve_leaves_its_start_up_objects_out_of_the_cycle_collector(models_dir):
    """Once its models are loaded, `serve` freezes what start-up made: each full collection of the cycle collector
    (a stream of events triggers one every few thousand tokens) would otherwise walk it all, holding the event
    loop meanwhile (docs/external-engines.md)."""
    with Server(models_dir=str(models_dir)) as srv:
        deadline = time.monotonic() + 120                 # the models load in the background
        while srv.logged(event="gc_frozen") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        frozen = [line for _, line in srv.log if line.get("event") == "gc_frozen"]
    assert len(frozen) == 1 and frozen[0]["objects"] > 10_000, frozen


def test_each_targets_default_pools_are_made_at_start_up_not_in_a_first_request(client):
    """A first generation does not write its KV pools inside its request (tens of MiB for our targets, hundreds
    for SmolLM2: a first token late by up to seconds, beside a long prefill once more than the 500 ms bound):
    the server makes every target's default pools at start-up, in the background, before anyone asks."""
    pg = client.app.state.playground
    expected = {f"target:{lm.name}" for lm in pg.registry.targets} | {f"draft:{pg.registry.drafts[0].name}"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pools = {p["name"] for p in client.get("/api/stats").json()["pools"]}
        if expected <= pools:
            break
        time.sleep(0.05)
    assert expected <= pools, (expected, pools)
    assert client.get("/api/stats").json()["sessions"] == 0           # no request has run


def test_the_page_shows_a_long_prefill_chunk_by_chunk(live_server):
    """/ws: while a long prompt prefills in chunks, the status says how far (`data-prefill`) and so does the
    draft lane; then the run goes on as usual."""
    from cli.bench.faults import LONG_TEXT

    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10, max_size=2 ** 24) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", prompt=LONG_TEXT, max_tokens="4", speed="5", method="none",
                         enable_prefix_caching=["false"])
            await c.until(status_is("done"))
            shown = [a["data-prefill"] for _, a in c.elements(lambda t, a: a.get("id") == "run-status")
                     if "data-prefill" in a]
            computed = [int(p.split("/")[0]) for p in shown]
            assert shown and computed == sorted(set(computed)), shown     # how many: as the sender coalesced them
            assert any("prompt tokens done" in f.raw for f in c.messages)

    run(scenario())


# --- DNS rebinding: the Host header ------------------------------------------------------------------------------
def host_answers(base: str, host: str, path: str, upgrade: bool = False) -> int:
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    headers = {"Host": host}
    if upgrade:
        headers.update({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Origin": f"http://{host}"})
    conn.request("GET", path, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


@pytest.mark.parametrize("path, upgrade", [("/", False), ("/api/stats", False), ("/api/ws", True), ("/ws", True)])
def test_a_foreign_host_name_is_refused_and_the_local_names_are_accepted(live_server, path, upgrade):
    port = live_server.rsplit(":", 1)[1]
    assert host_answers(live_server, f"evil.example:{port}", path, upgrade) == 400
    assert host_answers(live_server, "evil.example", path, upgrade) == 400
    for name in ("localhost", "127.0.0.1", "[::1]"):
        assert host_answers(live_server, f"{name}:{port}", path, upgrade) == (101 if upgrade else 200), name


def test_the_host_rule_follows_host_and_allowed_host():
    from app.security import HostMiddleware

    local = HostMiddleware(None, (), "127.0.0.1")
    assert local.allows("LOCALHOST:8000") and local.allows("[::1]:80") and not local.allows("evil.example")
    assert not local.allows("192.168.1.5:8000") and not local.allows(None)
    named = HostMiddleware(None, ("playground.example",), "myhost")
    assert named.allows("myhost:8000") and named.allows("Playground.Example") and not named.allows("other.example")
    anywhere = HostMiddleware(None, (), "0.0.0.0")                # every address: any IP, still no foreign name
    assert anywhere.allows("192.168.1.5:8000") and anywhere.allows("[fe80::1]:8000")
    assert not anywhere.allows("evil.example:8000")
    assert HostMiddleware(None, ("*",), "127.0.0.1").allows("evil.example")


def test_a_wrong_token_anywhere_refuses_and_a_right_one_in_either_place_admits():
    from app.security import supplied_tokens, token_matches

    def scope(query: str = "", bearer: str | None = None) -> dict:
        headers = [(b"authorization", f"Bearer {bearer}".encode())] if bearer else []
        return {"query_string": query.encode(), "headers": headers}

    right = "workshop-secret"
    assert token_matches(supplied_tokens(scope(f"token={right}")), right)
    assert token_matches(supplied_tokens(scope(bearer=right)), right)
    assert token_matches(supplied_tokens(scope(f"token={right}", right)), right)
    assert not token_matches(supplied_tokens(scope("token=wrong", right)), right)     # issue 19, item 7
    assert not token_matches(supplied_tokens(scope(f"token={right}", "wrong")), right)
    assert not token_matches(supplied_tokens(scope()), right)
