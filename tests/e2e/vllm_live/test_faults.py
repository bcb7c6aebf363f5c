"""vLLM's faults, live: a server that cannot start says why (vLLM's own words) instead of hanging and leaves
nothing behind; one that dies mid-run gives that run an error naming it, the app starts it again, and the
next run works."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from ws_client import connect, get_json, run

from engine.external.vllm_server import VARIANTS, VllmServer, default_venv
from engine.model.fetched import cache_dir

PLAIN = VARIANTS["plain"].label


def test_a_vllm_that_cannot_start_says_why_and_leaves_nothing(tmp_path):
    venv = default_venv(cache_dir())
    if not (venv / "bin" / "python").is_file():
        pytest.skip(f"!!! vLLM not installed at {venv} (make vllm) !!!")
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"}))
    server = VllmServer(VARIANTS["plain"], venv, broken, tmp_path / "vllm")
    t0 = time.monotonic()
    server.start()
    pid = server.process.pid
    ok = run(server.wait_ready(timeout_s=300), timeout=320)
    server.stop()
    assert not ok and server.state == "failed" and server.engine.description["ready"] is False
    assert "exited with code" in server.error and "nosuch" in server.error.lower(), server.error
    assert time.monotonic() - t0 < 300
    assert not server.run_dir.exists(), "its sockets and temporary files were left behind"
    assert "nosuch" in server.failed_log_path.read_text().lower()         # its whole log, for the operator
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)                                    # no process of its group is left


def test_a_vllm_that_dies_mid_run_errors_that_run_then_comes_back(vllm_app):
    base_url, app = vllm_app
    server = next(s for s in app.state.playground.vllm.servers if s.engine.name == PLAIN)

    async def killed_mid_run():
        async with connect(base_url) as c:
            await c.send(type="start", prompt="Write a long story about a lighthouse keeper.",
                         settings={"model": PLAIN, "max_tokens": 1000})
            await c.until("token", timeout=60)
            os.killpg(server.process.pid, signal.SIGKILL)
            return await c.until("error", "done", timeout=90)
    killed = server.process.pid
    ended = run(killed_mid_run(), timeout=120)
    assert ended["type"] == "error" and PLAIN in ended["message"], ended
    deadline, states = time.monotonic() + 600, []
    for wanted in ("not ready", "ready"):                 # noticed (failed, then starting again), then ready
        while (states[-1:] == ["ready"]) != (wanted == "ready") or not states:
            states.append(next(m["state"] for m in get_json(base_url + "/api/models")["models"] if m["name"] == PLAIN))
            assert time.monotonic() < deadline, f"vLLM was not started again: {states[-5:]}"
            time.sleep(0.5)
    assert server.process.pid != killed and "starting" in states, states

    async def next_run():
        async with connect(base_url) as c:
            await c.send(type="start", prompt="Name a colour.", settings={"model": PLAIN, "max_tokens": 8})
            return await c.until("done", "error", timeout=120)
    assert run(next_run(), timeout=150)["type"] == "done"
