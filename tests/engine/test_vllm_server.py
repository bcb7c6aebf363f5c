"""How the playground starts vLLM (engine/external/vllm_server.py), offline: its command line and environment,
its error excerpt, the cleaning of run folders left by a killed process, the Shoot-out's vLLM row while it starts
and once it failed (the live start and stop: tests/e2e/vllm_live/test_faults.py)."""
import asyncio
import json
import concurrent.futures
import os
import random
import socket
from pathlib import Path

import pytest

from engine.experiments.shootout import vllm_row
from engine.serving.request_fit import MAX_SPECULATIVE_TOKENS
from engine.serving.settings import SUFFIX_SETTINGS, GenerationSettings
from engine.external.vllm_server import (SERVED_VARIANTS, SUFFIX, VARIANTS, VllmServer, ephemeral_ports,
                                         error_excerpt, free_port, remove_stale_runs, suffix_unavailable_reason)


def server(tmp_path, key="ngram", **kw):
    return VllmServer(VARIANTS[key], tmp_path / "venv", tmp_path / "model", tmp_path / "vllm", **kw)


def test_it_listens_on_loopback_in_float32_and_its_key_is_not_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODING_PLAYGROUND_TOKEN", "secret-of-ours")
    s = server(tmp_path)
    cmd, env = s.command(s.port), s.environment(s.engine.api_key)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in cmd and '"method": "ngram"' in cmd[cmd.index("--speculative-config") + 1]
    assert s.engine.api_key not in " ".join(cmd) and env["VLLM_API_KEY"] == s.engine.api_key
    assert not any(k.startswith("DECODING_PLAYGROUND") for k in env), "our settings reached vLLM"
    assert all(Path(env[k]).is_relative_to(tmp_path) for k in ("TMPDIR", "VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT",
                                                                "HOME", "XDG_CACHE_HOME", "VLLM_CONFIG_ROOT"))
    assert s.engine.base_url == f"http://127.0.0.1:{s.port}/v1" and s.engine.kind == "vllm"
    assert s.describe()["ready"] is False and s.describe()["state"] == "stopped"


def test_its_port_is_free_and_outside_the_range_other_processes_get_from_the_kernel():
    """Another process's bind(0) (a second vLLM's internal sockets) cannot take the port before vLLM binds it."""
    low = ephemeral_ports()[0]
    ports = {free_port(random.Random(seed)) for seed in range(20)}
    assert all(p < low for p in ports) and len(ports) > 1
    with socket.socket() as taken:                       # a port in use is never chosen
        taken.bind(("127.0.0.1", min(ports)))
        taken.listen()
        for seed in range(20):
            assert free_port(random.Random(seed)) != min(ports)


def test_the_eagle_variant_names_the_exported_head(tmp_path):
    s = server(tmp_path, "eagle", draft_dir=tmp_path / "head")
    assert f'"model": "{tmp_path / "head"}"' in s.command(1)[s.command(1).index("--speculative-config") + 1]


def test_the_draft_model_variant_names_the_exported_draft_and_refuses_to_start_without_it(tmp_path):
    s = server(tmp_path, "draft_model", draft_dir=tmp_path / "draft")
    spec = s.command(1)[s.command(1).index("--speculative-config") + 1]
    assert '"method": "draft_model"' in spec and '"num_speculative_tokens": 4' in spec
    assert f'"model": "{tmp_path / "draft"}"' in spec
    with pytest.raises(ValueError, match="draft_model variant needs its drafter"):
        server(tmp_path, "draft_model").command(1)


def test_the_suffix_variant_passes_vllms_suffix_settings_and_needs_arcticinferences_tree(tmp_path):
    """vLLM's settings as its SpeculativeConfig names them, γ within ours; offered only where the venv has
    ArcticInference's compiled suffix tree (make vllm builds it)."""
    s = server(tmp_path, "suffix")
    cmd = s.command(s.port)
    spec = cmd[cmd.index("--speculative-config") + 1]
    assert json.loads(spec) == SUFFIX and SUFFIX["method"] == "suffix"
    assert set(SUFFIX) == {"method", "num_speculative_tokens", *SUFFIX_SETTINGS}      # our names are vLLM's
    defaults = GenerationSettings()
    assert all(SUFFIX[k] == getattr(defaults, k) for k in SUFFIX_SETTINGS)        # vLLM's defaults, and ours
    assert SUFFIX["num_speculative_tokens"] == MAX_SPECULATIVE_TOKENS
    venv = tmp_path / "venv"
    assert "make vllm" in suffix_unavailable_reason(venv)
    package = venv / "lib" / "python3.11" / "site-packages" / "arctic_inference" / "suffix_decoding"
    package.mkdir(parents=True)
    (package / "cache.py").write_text("")
    assert suffix_unavailable_reason(venv) is not None          # the Python wrapper alone cannot run
    (package / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert suffix_unavailable_reason(venv) is None


def test_the_error_excerpt_is_vllms_own_words_without_its_warnings():
    log = ("(APIServer) WARNING [x] fd limit errors like OSError: [Errno 24]\nTraceback (most recent call last):\n"
           "  File x\nValueError: No supported config format found in /m\n(EngineCore) ERROR engine failed\n")
    text = error_excerpt(log)
    assert "ValueError: No supported config format" in text and "ERROR engine failed" in text
    assert "WARNING" not in text and error_excerpt("") == "no output"


def test_run_folders_of_gone_processes_are_removed(tmp_path):
    mine, gone = tmp_path / f"{os.getpid()}-plain", tmp_path / "999999999-plain"
    mine.mkdir(), gone.mkdir()
    remove_stale_runs(tmp_path)
    assert mine.exists() and not gone.exists()


def test_the_shootouts_vllm_row_says_starting_then_why_vllm_failed(tmp_path):
    """A vLLM that cannot start (a stand-in interpreter that writes an error and exits): the Shoot-out's row of
    our head in vLLM says it is starting, then vLLM's own words; other models get no such row."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'ValueError: no CPU backend here' >&2\nexit 3\n")
    python.chmod(0o755)
    s = server(tmp_path, "eagle", draft_dir=tmp_path / "head")
    shootout = {"model": "smollm2-135m", "gamma": 3}

    async def scenario():
        starting = await vllm_row(shootout, "Hi", True, None, s)
        assert not await s.wait_ready(poll_s=0.05)
        failed = await vllm_row(shootout, "Hi", True, None, s)
        other = await vllm_row({**shootout, "model": "target-mha"}, "Hi", True, None, s)
        return starting, failed, other

    s.start()
    try:   # a loop of its own, in its own thread: an earlier test may leave one running in this thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            starting, failed, other = pool.submit(asyncio.run, scenario()).result()
    finally:
        s.stop()
    assert starting["unavailable"].startswith("starting (") and starting["gamma"] == 3
    assert failed["unavailable"] == "failed: vLLM exited with code 3 while starting: ValueError: no CPU backend here"
    assert other is None


def test_serve_starts_every_variant_by_default_and_a_wrong_one_is_refused_naming_them():
    from app.config import AppConfig, ConfigError
    assert AppConfig().vllm_variants == ("plain", "ngram", "eagle", "draft_model") == SERVED_VARIANTS
    with pytest.raises(ConfigError, match="vllm_variants: some of plain, ngram, eagle, draft_model, got 'medusa'"):
        AppConfig(vllm_variants=("medusa",))
