"""What a served room shows its operator: Prometheus metrics with vLLM's names, stats per pool, logs without
prompts (real uvicorn, `websockets`), and the `bench serve` and `serve` commands as processes of their own.
tests/test_serving.py has the room's limits, admission, disconnects and fuzzing."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from ws_client import PROMPT, connect, get_json, run


@pytest.fixture(scope="module")
def room_server(models_dir):
    """Room for a workshop, as tests/test_serving.py's: 32 generations, 100 in line, no practical rate limit."""
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    config = AppConfig(models_dir=models_dir, max_sessions=32, max_queue=100, messages_per_s=1e6, message_burst=10 ** 6)
    with serve(create_app(config)) as url:
        yield url


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
