"""engine/external/openai_stream.py against a hostile server on loopback (tests/hostile_engine.py) and against a real
llama.cpp server (xllamacpp, the SmolLM2 GGUF)."""
import asyncio
import concurrent.futures
import re
import time

import httpx
import pytest
from hostile_engine import HostileEngine

from engine.external.llamacpp_server import EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.external.openai_stream import ExternalEngine, StreamLimits, stream_chat

LIMITS = StreamLimits(connect_s=2.0, stall_s=1.0, total_s=3.0, max_line_bytes=64 * 1024)


def run(engine: ExternalEngine, prompt: str = "Hi", settings: dict | None = None) -> list:
    """The events of one generation, on a fresh event loop in its own thread (Playwright's sync API, used by
    the browser tests of the same session, keeps a loop running in the main thread)."""
    async def collect():
        return [e async for e in stream_chat(engine, prompt, settings or {"max_tokens": 8})]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, collect()).result()


@pytest.fixture(scope="module")
def hostile():
    with HostileEngine() as server:
        yield server


def engine_at(hostile, scenario: str) -> ExternalEngine:
    return ExternalEngine(f"test-{scenario}", hostile.url(scenario), limits=LIMITS)


def test_a_well_formed_stream_gives_tokens_and_done(hostile):
    events = run(engine_at(hostile, "ok"))
    assert [e.type for e in events][0] == "started"
    assert [e.text for e in events if e.type == "token"] == ["Hello", ",", " world"]
    done = events[-1]
    assert done.type == "done"
    assert done.summary["text"] == "Hello, world" and done.summary["finish_reason"] == "stop"
    assert done.summary["num_output_tokens"] == 3 and done.summary["ttft_ms"] > 0
    contract = {"text", "num_output_tokens", "tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                "acceptance_rate", "mean_acceptance_length", "accepted_per_position", "target_forward_calls",
                "draft_forward_calls", "elapsed_s", "ttft_s", "tpot_s", "kv_cache", "model", "settings"}
    assert contract <= done.summary.keys()


@pytest.mark.parametrize("scenario, message", [
    ("bad-json", r"an event is not JSON"),
    ("server-error", r"HTTP 500: .*out of memory"),
    ("html", r"expected text/event-stream, got 'text/html"),
    ("huge", r"a line of the event stream is over 65536 bytes"),
    ("never-ends", r"no end after 3 s \(total timeout\)"),
    ("stalls", r"nothing received for 1 s \(stall timeout\)"),
    ("no-done", r"the stream ended before data: \[DONE\]"),
])
def test_each_hostile_answer_is_a_clear_error_in_time_and_the_next_generation_works(hostile, scenario, message):
    t0 = time.monotonic()
    events = run(engine_at(hostile, scenario))
    elapsed = time.monotonic() - t0
    assert events[-1].type == "error", [e.type for e in events]
    assert re.search(message, events[-1].message), events[-1].message
    assert events[-1].message.startswith(f"test-{scenario}: ")
    # bounded: total 3 s or stall 1 s, plus one stall period at most (the deadline is checked when bytes come)
    assert elapsed < LIMITS.total_s + LIMITS.stall_s + 1.0, elapsed
    assert run(engine_at(hostile, "ok"))[-1].type == "done"


def test_an_engine_that_is_down_is_a_clear_error():
    with HostileEngine() as server:
        url = server.url("ok")
    events = run(ExternalEngine("gone", url, limits=LIMITS))
    assert events[-1].type == "error" and "gone: cannot reach the server" in events[-1].message


def test_settings_a_server_fixes_at_start_up_are_named_not_ignored(hostile):
    events = run(engine_at(hostile, "ok"), settings={"max_tokens": 4, "kv_cache_dtype": "int8", "num_kv_heads": 1})
    notes = [n for e in events if e.type == "settings_applied" for n in e.notes]
    assert notes == ["set by the server at start-up (test-ok), not applied: kv_cache_dtype, num_kv_heads"]


# --- a real llama.cpp server ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def llamacpp():
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"!!! llama.cpp tests SKIPPED: {reason} !!!")
    server = EmbeddedLlamaCpp.start(gguf_path(), threads=1)
    yield server
    server.close()


def metric(engine: ExternalEngine, name: str) -> float:
    text = httpx.get(engine.metrics_url, headers=engine.headers(), timeout=10).text
    return float(re.search(rf"^llamacpp:{name} (\S+)$", text, re.M).group(1))


def test_llamacpp_streams_a_chat_and_its_metrics_move_by_the_tokens(llamacpp):
    engine = llamacpp.engine
    before = metric(engine, "tokens_predicted_total")
    events = run(engine, "Count from one to ten.", {"max_tokens": 12})
    done = events[-1]
    assert done.type == "done", events[-1]
    assert done.summary["engine_usage"]["completion_tokens"] == 12 and done.summary["finish_reason"] == "length"
    assert [e.type for e in events if e.type == "prefill"] == ["prefill"]
    assert done.summary["engine_tokens_per_s"] > 0 and done.summary["tokens_per_s"] > 0
    assert metric(engine, "tokens_predicted_total") - before == 12


def test_llamacpp_refuses_a_request_without_its_key(llamacpp):
    r = httpx.post(llamacpp.engine.base_url + "/chat/completions", json={"messages": []}, timeout=10)
    assert r.status_code == 401


def test_server_metrics_of_vllm_and_llamacpp_are_read_and_summed_over_labels():
    from engine.external.server_metrics import parse_prometheus
    text = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 96.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 12.0
vllm:request_success_total{finished_reason="stop"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 17.0
llamacpp:tokens_predicted_total 8
llamacpp:requests_processing NaN
not a metric line
"""
    assert parse_prometheus(text) == {"vllm:kv_cache_usage_perc": 0.25, "vllm:prefix_cache_hits_total": 96.0,
                                      "vllm:spec_decode_num_accepted_tokens_total": 42.0,
                                      "llamacpp:tokens_predicted_total": 8.0,
                                      "vllm:spec_decode_num_accepted_tokens_pos0_total": 25.0,
                                      "vllm:spec_decode_num_accepted_tokens_pos1_total": 17.0}


def test_the_server_gauges_read_vllm_s_series_and_say_where_a_server_publishes_none():
    from engine.external.server_metrics import server_gauges
    rows = {r["label"]: r["text"] for r in server_gauges({
        "vllm:kv_cache_usage_perc": 0.25, "vllm:num_requests_running": 3.0, "vllm:prefix_cache_hits_total": 96.0,
        "vllm:spec_decode_num_accepted_tokens_total": 42.0, "vllm:spec_decode_num_draft_tokens_total": 60.0,
        "vllm:generation_tokens_total": 1234.0, "vllm:spec_decode_num_accepted_tokens_pos0_total": 30.0,
        "vllm:spec_decode_num_accepted_tokens_pos1_total": 12.0})}
    assert rows == {"KV cache used": "25.0%", "Requests running": "3", "Requests waiting": "–",
                    "Prefix-cache hits": "96", "Draft tokens accepted": "42 / 60", "Tokens generated": "1,234",
                    "Accepted by draft position": "30 · 12"}
    assert {r["text"] for r in server_gauges({})} == {"–"}
