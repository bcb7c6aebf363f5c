"""`/api/ws` against a real uvicorn server with the `websockets` client (see tests/live_server.py for why);
tests/test_ws_admission.py has origins and the line for a free slot.

The tests never depend on which tokens a model writes: only on what the engine reports about them.
Waits are bounded (`asyncio.wait_for`); "nothing arrives" is checked over a short, stated window.
"""
from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from ws_client import PROMPT, Client, connect, get_json, run, wait_for_stats, ws_url


# --- bad input: an error event, and the same connection then works ------------------------------------
@pytest.mark.parametrize("bad, needle", [
    ("this is not json", "not valid JSON"),
    ("[1, 2, 3]", "JSON object"),
    (json.dumps({"prompt": "x"}), "type"),
    (json.dumps({"type": "dance"}), "unknown message type"),
    (json.dumps({"type": "start"}), "prompt"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"gamma": 3}}), "gamma"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"num_speculative_tokens": 99}}),
     "num_speculative_tokens"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"temperature": -1}}), "temperature"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"kv_cache_dtype": "int3"}}), "kv_cache_dtype"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"block_size": 12}}), "block_size"),
    (json.dumps({"type": "start", "prompt": "x", "settings": {"rejection_sample_method": "tree"}}),
     "rejection_sample_method"),
    (json.dumps({"type": "start", "prompt": ""}), "prompt"),
    (json.dumps({"type": "start", "prompt": "x" * 9000}), "prompt"),
    (json.dumps({"type": "start", "prompt": "x", "speed": "warp"}), "speed"),
    (json.dumps({"type": "pause"}), "no generation"),
    (json.dumps({"type": "settings", "settings": {"num_speculative_tokens": 2}}), "no generation"),
])
def test_bad_input_gets_an_error_event_and_the_connection_then_completes_a_generation(live_server, bad, needle):
    async def scenario():
        async with connect(live_server) as c:
            await c.ws.send(bad)
            error = await c.recv()
            assert error["type"] == "error", error
            assert needle.lower() in error["message"].lower(), error
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 12})
            done = await c.until("done")
            assert done["num_output_tokens"] >= 1
            assert done["finish_reason"] in ("length", "stop")
            assert not [m for m in c.seen if m["type"] == "error" and m is not error]

    run(scenario())


def test_unknown_setting_error_names_the_setting_and_the_known_ones(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={"num_spec_tokens": 3})
            error = await c.recv()
            assert error["type"] == "error" and error["setting"] == "num_spec_tokens"
            assert "num_speculative_tokens" in error["message"]      # the known settings are listed

    run(scenario())


# --- a normal generation ------------------------------------------------------------------------------------
SUMMARY_FIELDS = {"text", "num_output_tokens", "tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                  "acceptance_rate", "mean_acceptance_length", "accepted_per_position", "target_forward_calls",
                  "draft_forward_calls", "elapsed_s", "ttft_s", "tpot_s", "kv_cache", "model", "settings"}


def test_a_generation_streams_events_in_order_and_ends_with_the_summary(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT,
                         settings={"max_tokens": 24, "method": "draft_model", "num_speculative_tokens": 3})
            done = await c.until("done")
            types = [m["type"] for m in c.seen]
            assert types[0] == "started" and types[1] == "prefill"
            assert types[-1] == "done"
            tokens = [m for m in c.seen if m["type"] == "token"]
            assert {t["status"] for t in tokens} <= {"accepted", "rejected", "resampled", "bonus", "target"}
            emitted = [t for t in tokens if t["status"] != "rejected"]
            assert len(emitted) == done["num_output_tokens"]
            assert "".join(t["text"] for t in emitted) == done["text"]
            assert SUMMARY_FIELDS <= done.keys()
            assert done["summary"]["num_output_tokens"] == done["num_output_tokens"]
            assert {"bytes_per_token", "bytes_used", "blocks_allocated", "dtype"} <= done["kv_cache"].keys()
            drafts = [m for m in c.seen if m["type"] == "draft"]
            assert drafts and all(1 <= len(d["tokens"]) <= 3 for d in drafts)
            metrics = [m for m in c.seen if m["type"] == "metrics"]
            assert metrics and {"acceptance_rate", "ttft_ms", "kv_bytes_per_token", "kv_blocks_used"} <= \
                metrics[-1]["values"].keys()

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0, stats


def test_same_seed_same_tokens(live_server):
    settings = {"max_tokens": 20, "temperature": 0.9, "seed": 1234, "num_speculative_tokens": 3}

    async def one():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, settings=settings)
            done = await c.until("done")
            return [(t["text"], t["status"]) for t in done["tokens"]]

    assert run(one()) == run(one())


# --- pacing: pause, step, resume, stop, speed ------------------------------------------------------------------
def test_pause_step_resume_and_stop(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 200}, paused=True)
            started = await c.recv()
            assert started["type"] == "started"
            paused = await c.recv()
            assert (paused["type"], paused["state"], paused["round"]) == ("state", "paused", 0)
            assert await c.quiet() == []                   # paused: nothing is computed

            await c.send(type="step")                      # the prefill round, then idle again
            paused = await c.until("state")
            assert (paused["state"], paused["round"]) == ("paused", 1)
            assert [m["type"] for m in c.seen].count("metrics") == 1
            assert await c.quiet() == []
            await c.send(type="step")                      # exactly one speculative round per step
            paused = await c.until("state")
            assert (paused["state"], paused["round"]) == ("paused", 2)
            assert [r["round"] for r in c.seen if r["type"] == "round"] == [1]
            assert await c.quiet() == []

            await c.send(type="resume")
            assert (await c.until("state"))["state"] == "running"
            await c.until("round")
            await c.until("round")                          # it runs on by itself
            await c.send(type="stop")
            done = await c.until("done")
            assert done["finish_reason"] == "cancelled"
            assert done["num_output_tokens"] < 200

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["kv_blocks_used"] == 0)
    assert stats["kv_blocks_used"] == 0


def test_speed_paces_rounds_but_engine_times_stay_the_engines(live_server):
    async def scenario():
        async with connect(live_server) as c:
            t0 = time.monotonic()
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 200, "method": "none"}, speed=10)
            for _ in range(6):
                await c.until("round")
            elapsed = time.monotonic() - t0
            rounds = [m for m in c.seen if m["type"] == "round"]
            await c.send(type="stop")
            await c.until("done")
            assert elapsed >= 0.45, elapsed                 # 6 rounds at 10 rounds/s: at least 0.5 s apart
            engine_s = sum(r["ms"] for r in rounds) / 1e3
            assert engine_s < 0.5 * elapsed, (engine_s, elapsed)   # the engine's own time, not the paced time

    run(scenario())


# --- live settings ------------------------------------------------------------------------------------------------
def test_settings_mid_stream_are_queued_then_applied_at_the_next_round(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT,
                         settings={"max_tokens": 300, "method": "draft_model", "num_speculative_tokens": 2}, speed=30)
            first = await c.until("draft")
            assert len(first["tokens"]) == 2
            before = (await c.until("metrics"))["values"]["kv_bytes_per_token"]
            await c.send(type="settings", settings={"num_speculative_tokens": 5, "kv_cache_dtype": "int8"})
            queued = await c.until("settings_queued")
            assert queued["changes"] == {"num_speculative_tokens": 5, "kv_cache_dtype": "int8"}
            applied = await c.until("settings_applied")
            assert applied["changes"]["num_speculative_tokens"] == 5
            assert applied["changes"]["kv_cache_dtype"] == "int8_per_token_head"
            after = await c.until("draft")
            assert len(after["tokens"]) == 5
            kv = await c.until("kv")
            assert kv["pools"][0]["kv_cache_dtype"] == "int8_per_token_head"
            metrics = await c.until("metrics")
            assert metrics["values"]["kv_bytes_per_token"] < before      # float32 -> int8 + scales
            await c.send(type="settings", settings={"num_speculative_tokens": 40})
            error = await c.until("error")
            assert error["setting"] == "num_speculative_tokens"
            await c.send(type="stop")
            await c.until("done")

    run(scenario())


def test_the_verification_rule_is_a_live_setting(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, speed=30, settings={
                "max_tokens": 200, "method": "draft_model", "temperature": 1, "rejection_sample_method": "block"})
            token = await c.until("token")
            while token["status"] not in ("accepted", "rejected"):
                token = await c.until("token")
            assert token["stop_prob"] is not None and token["standard_status"] is not None
            await c.send(type="settings", settings={"rejection_sample_method": "standard"})
            applied = await c.until("settings_applied")
            assert applied["changes"] == {"rejection_sample_method": "standard"}
            await c.send(type="stop")
            done = await c.until("done")
            assert done["settings"]["rejection_sample_method"] == "standard"
            assert done["block_verification"]["num_drafts"] < done["num_drafts"]

    run(scenario())


def test_the_server_keeps_receiving_while_it_streams(live_server):
    """Every settings message sent mid-stream is answered while the stream is still running."""
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 400, "method": "none"}, speed=40)
            await c.until("round")
            for gamma in (2, 3, 4, 5, 6):
                await c.send(type="settings", settings={"num_speculative_tokens": gamma})
                queued = await c.until("settings_queued", timeout=5)
                assert queued["changes"] == {"num_speculative_tokens": gamma}
            assert not any(m["type"] == "done" for m in c.seen)
            await c.send(type="stop")
            await c.until("done")

    run(scenario())


# --- disconnects free the blocks --------------------------------------------------------------------------------------
def test_disconnect_mid_stream_frees_every_block(live_server):
    async def scenario():
        clients = []
        for i in range(3):
            # max_queue=None: a client that stops reading with more than 16 messages unread would pause its own
            # reading and never see the server's close reply (websockets' flow control; 10 s timeout each)
            c = Client(await websockets.connect(ws_url(live_server), open_timeout=10, max_queue=None))
            await c.send(type="start", prompt=PROMPT + str(i), settings={"max_tokens": 400, "method": "draft_model"},
                         speed=20)
            clients.append(c)
        for c in clients:
            await c.until("kv")
        busy = get_json(live_server + "/api/stats")
        assert busy["sessions"] == 3 and busy["kv_blocks_used"] > 0, busy
        for c in clients:
            await c.ws.close()

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0, stats
    assert stats["kv_blocks_total"] > 0


def test_a_vanished_client_mid_stream_frees_its_blocks(live_server):
    """The TCP connection drops without a close frame (as when a laptop lid shuts)."""
    async def scenario():
        c = Client(await websockets.connect(ws_url(live_server), open_timeout=10))
        await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 400}, speed=20)
        await c.until("kv")
        c.ws.transport.abort()

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0, stats


def test_an_engine_failure_is_reported_and_the_connection_and_server_stay_up(live_server, monkeypatch):
    """A bug inside a round (simulated) ends that generation with an error event, not the connection."""
    from engine.serving.session import GenerationSession

    original = GenerationSession._round

    def broken(self):
        if self.round >= 2:
            raise RuntimeError("simulated engine bug")
        return original(self)

    async def scenario():
        async with connect(live_server) as c:
            monkeypatch.setattr(GenerationSession, "_round", broken)
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 50})
            error = await c.until("error")
            assert "simulated engine bug" in error["message"]
            monkeypatch.setattr(GenerationSession, "_round", original)
            await c.send(type="start", prompt=PROMPT, settings={"max_tokens": 8})
            assert (await c.until("done"))["num_output_tokens"] >= 1

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0, stats


def test_a_client_that_never_reads_is_closed_before_it_costs_memory():
    """Answers to a client that sends but never reads (its socket full) pile up; past a bound it is closed (1008)."""
    from app.config import AppConfig
    from app.state import Playground
    from app.views.json import JsonView
    from app.ws.connection import Connection
    from app.ws.socket import MAX_UNSENT_ITEMS

    class StuckSocket:                          # receives at once, never finishes a send
        def __init__(self):
            self.received, self.closed = 0, None

        async def receive(self):
            self.received += 1
            await asyncio.sleep(0)
            return {"type": "websocket.receive", "text": '{"type": "pause"}'}

        async def send_text(self, text):
            await asyncio.Event().wait()

        async def close(self, code=1000, reason=None):
            self.closed = code

    async def scenario():
        ws = StuckSocket()
        config = AppConfig(messages_per_s=1e9, message_burst=10 ** 9)      # the rate limit is tested elsewhere
        await asyncio.wait_for(Connection(ws, Playground(config), JsonView()).serve(), 10)
        return ws

    ws = run(scenario())
    assert ws.closed == 1008
    assert MAX_UNSENT_ITEMS < ws.received <= MAX_UNSENT_ITEMS + 3
