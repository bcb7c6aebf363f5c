"""The KV memory budget on a real server (`kv_cache_memory`, serve --kv-cache-memory): a client's settings change whose
pool does not fit beside the pools in use gets an `error` naming the setting and its generation runs on; when the
pool in use is idle again it is freed for the new one; /api/stats and /metrics list the pools there are, with their
bytes, never more than the budget; the teaching views that show pools keep working when one is freed.

The server serves our models only (no fetched SmolLM2: its warm-up would take room in the budget these tests size).
"""
from __future__ import annotations

import os
import urllib.request

import pytest

from ws_client import PROMPT, connect, get_json, run

STEP = {"type": "step"}


@pytest.fixture(scope="module")
def sizes(models_dir):
    """Bytes of the pools the scenario uses, from the engine's own sizing (2 sessions a pool)."""
    from engine.serving.registry import InferenceEngine, ModelRegistry
    from engine.serving.settings import GenerationSettings

    engine = InferenceEngine(ModelRegistry.from_dir(models_dir, fetched=False), max_sessions=2)
    target = engine.registry.default_target()

    def of(**settings):
        return sum(s.nbytes for s in engine.pool_specs(target, GenerationSettings.parse(settings)).values())
    return {"a": of(method="draft_model"), "held": of(method="none", kv_cache_dtype="float16", block_size=8),
            "asked": of(method="draft_model", kv_cache_dtype="bfloat16", block_size=32), "model": target.name}


@pytest.fixture(scope="module")
def budget_server(models_dir, sizes):
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    budget = sizes["a"] + sizes["held"] + sizes["asked"] - 1       # one byte short of all three at once
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECODING_PLAYGROUND_CACHE", os.devnull)         # no fetched models
        with serve(create_app(AppConfig(models_dir=models_dir, max_sessions=2, kv_cache_memory=budget,
                                        demo="character"))) as url:
            yield url


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def check_figures(url: str) -> dict:
    """/api/stats and /metrics agree on the pools there are, and they hold no more than the budget."""
    stats = get_json(url + "/api/stats")
    assert stats["kv_pool_bytes"] == sum(p["bytes"] for p in stats["pools"]) <= stats["kv_cache_memory"], stats
    text = metrics_text(url)
    lines = [line for line in text.splitlines() if line.startswith("playground_kv_pool_bytes{")]
    assert len(lines) == len(stats["pools"]), (lines, stats["pools"])
    for p in stats["pools"]:
        assert any(f'pool="{p["name"]}"' in line and f'kv_cache_dtype="{p["kv_cache_dtype"]}"' in line
                   and f'block_size="{p["block_size"]}"' in line and float(line.rpartition(" ")[2]) == p["bytes"]
                   for line in lines), (p, lines)
    budget = [line for line in text.splitlines() if line.startswith("playground_kv_cache_memory_bytes ")]
    assert len(budget) == 1 and float(budget[0].rpartition(" ")[2]) == stats["kv_cache_memory"], budget
    return stats


def keys(stats: dict) -> set:
    return {(p["name"], p["kv_cache_dtype"], p["block_size"]) for p in stats["pools"]}


def test_a_change_over_the_budget_is_an_error_and_runs_once_the_pool_in_use_is_idle(budget_server, sizes):
    model = sizes["model"]
    held_key, asked_key = (f"target:{model}", "float16", 8), (f"target:{model}", "bfloat16", 32)

    async def scenario():
        async with connect(budget_server) as a, connect(budget_server) as held, connect(budget_server) as c:
            await a.send(type="start", prompt=PROMPT, paused=True, settings={"model": model, "method": "draft_model",
                                                                            "max_tokens": 40})
            await a.until("started")
            await a.send(**STEP)
            await a.until("metrics")
            await held.send(type="start", prompt=PROMPT, paused=True, settings={
                "model": model, "method": "none", "kv_cache_dtype": "float16", "block_size": 8, "max_tokens": 40})
            await held.until("started")
            await held.send(**STEP)
            await held.until("metrics")
            assert held_key in keys(check_figures(budget_server))

            await a.send(type="settings", settings={"kv_cache_dtype": "bfloat16", "block_size": 32})
            error = await a.until("error", "settings_queued")
            assert error["type"] == "error" and error["setting"] == "kv_cache_dtype", error
            assert "KV cache memory" in error["message"] and "--kv-cache-memory" in error["message"]
            await a.send(**STEP)                       # the generation runs on, in the pool it had
            kv = await a.until("kv")
            assert {(p["kv_cache_dtype"], p["block_size"]) for p in kv["pools"]} == {("auto", 16)}
            await c.send(type="start", prompt=PROMPT, settings={             # a start that needs it too
                "model": model, "method": "draft_model", "kv_cache_dtype": "bfloat16", "block_size": 32})
            error = await c.until("error", "started", "queued")
            assert error["type"] == "error" and error["setting"] == "kv_cache_dtype", error
            stats = check_figures(budget_server)
            assert stats["kv_pools_refused"] >= 2 and asked_key not in keys(stats)

            await held.send(type="stop")               # the other generation ends: its pool is idle
            assert (await held.until("done"))["finish_reason"] == "cancelled"
            await a.send(type="settings", settings={"kv_cache_dtype": "bfloat16", "block_size": 32})
            await a.until("settings_queued")
            await a.send(**STEP)
            applied = await a.until("settings_applied")
            assert applied["changes"] == {"kv_cache_dtype": "bfloat16", "block_size": 32}
            stats = check_figures(budget_server)
            assert asked_key in keys(stats) and held_key not in keys(stats) and stats["kv_pools_freed"] >= 1
            await a.send(type="resume")
            assert (await a.until("done"))["finish_reason"] == "length"
            await c.send(type="start", prompt=PROMPT, settings={"model": model, "max_tokens": 8})   # the refused
            assert (await c.until("done"))["num_output_tokens"] == 8                              # connection runs

            # the freed pool is made again for a new run, which generates
            await held.send(type="start", prompt=PROMPT, settings={
                "model": model, "method": "none", "kv_cache_dtype": "float16", "block_size": 8, "max_tokens": 8})
            assert (await held.until("done"))["num_output_tokens"] == 8
            check_figures(budget_server)

    run(scenario())
    with urllib.request.urlopen(budget_server + "/teach/paging/live", timeout=10) as r:   # the live pools' view
        page = r.read().decode()
    assert r.status == 200 and "bfloat16" in page


def test_the_kv_map_says_a_freed_pool_is_gone_instead_of_drawing_it():
    from app.views.frame import Frame
    from app.views.kv_map import KvMap
    from engine.kv.cache import KVCacheManager
    from engine.model.config import ModelConfig
    from engine.serving.events import KVBlocks

    manager = KVCacheManager(ModelConfig.from_name("tiny"), 8, 16, "float16", name="target:t")
    kv_map = KvMap()
    frame = Frame(kv_events=[KVBlocks([], [manager.snapshot().drawn("target", [0])])])
    kv_map.render(frame, lambda key: None, external=False)
    assert 'data-pool="target:t"' in frame.replace["kv-target-grid"]
    after = Frame(kv_snapshot=True)                      # the run ended, and its pool has been freed since
    kv_map.render(after, lambda key: None, external=False)
    assert "target:t (float16, block size 16) has been freed" in after.replace["kv-target-grid"]
    assert "target" not in kv_map.drawn


def test_the_kv_cache_memory_option_reads_sizes():
    from app.config import AppConfig, ConfigError

    assert AppConfig(kv_cache_memory="1.5GiB").kv_cache_memory == 3 * 2 ** 29
    assert AppConfig(kv_cache_memory="800 MiB").kv_cache_memory == 800 * 2 ** 20
    assert AppConfig(kv_cache_memory="2GB").kv_cache_memory == 2 * 10 ** 9
    assert AppConfig(kv_cache_memory="3").kv_cache_memory == 3 * 2 ** 30        # a plain number: GiB
    assert AppConfig.from_env({"DECODING_PLAYGROUND_KV_CACHE_MEMORY": "64MiB"}).kv_cache_memory == 64 * 2 ** 20
    assert AppConfig().kv_cache_memory is None                                 # the engine's default
    for bad in ("lots", "0", "-1GiB", "1e9", "512KiB"):
        with pytest.raises(ConfigError) as e:
            AppConfig(kv_cache_memory=bad)
        assert e.value.field == "kv_cache_memory"


def test_a_generation_has_released_its_pools_when_its_done_is_delivered(models_dir, sizes):
    """`done` reaches the client before the engine thread goes on: a client acting on it at once (a new start or
    a settings change that needs the ended generation's pool freed) must find that pool idle already."""
    from engine.serving.registry import InferenceEngine, ModelRegistry
    from engine.serving.scheduler import Scheduler
    from engine.serving.session import GenerationSession

    budget = sizes["a"] + sizes["asked"] - 1            # the asked pool fits only once the first is freed
    engine = InferenceEngine(ModelRegistry.from_dir(models_dir, fetched=False), max_sessions=2,
                             kv_cache_memory=budget)
    first = GenerationSession(engine, PROMPT, {"model": sizes["model"], "method": "draft_model", "max_tokens": 6})
    seen = {}

    def sink(event):                                    # called in the engine's thread, as a connection's is
        if event.type == "done":
            seen["blocks"] = sum(m.pool.num_used_blocks for m in engine.managers.values())
            seen["next"] = GenerationSession(engine, PROMPT, {"model": sizes["model"], "method": "draft_model",
                                                              "kv_cache_dtype": "bfloat16", "block_size": 32})
    scheduler = Scheduler()
    scheduler.add(first, sink)
    for _ in range(1000):
        if not scheduler.step():
            break
    assert seen["blocks"] == 0 and engine.pools.freed == 1
    seen["next"].close()
