"""32 sessions drafting token trees at once against a real server on the shipped character model and its heads
(EAGLE-2's dynamic trees, Medusa's trees, n-gram trees), in every KV cache dtype and block size, greedy and
sampled: some run to their end, some are stopped, some clients close or vanish mid-stream. Every KV block comes
back: the server's /api/stats shows 0 blocks used and 0 sessions once they are gone (the issue's `bench serve`
target for trees, checked here rather than in the bench)."""
from __future__ import annotations

import asyncio

import pytest
import websockets

from engine.kv.dtypes import KV_CACHE_DTYPES
from engine.serving.registry import MODELS_DIR
from engine.spec_decode.heads import available_heads
from ws_client import Client, get_json, run, wait_for_stats, ws_url

SESSIONS = 32
PROMPT = "class Stack:\n    def "
SHAPES = [("eagle", 3, 3, 8), ("medusa", 3, 2, 8), ("ngram", 3, 2, 6), ("eagle", 4, 4, 16)]   # method, depth, k, n


@pytest.fixture(scope="module")
def tree_server():
    if not (MODELS_DIR / "index.json").is_file() or len(available_heads("target-mha")) < 2:
        pytest.skip("the shipped character models and their EAGLE and Medusa heads are needed")
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    config = AppConfig(models_dir=MODELS_DIR, demo="character", max_sessions=SESSIONS, max_queue=SESSIONS)
    with serve(create_app(config)) as base_url:
        yield base_url


def settings(i: int) -> dict:
    method, depth, topk, budget = SHAPES[i % len(SHAPES)]
    return {"model": "target-mha", "method": method, "num_speculative_tokens": depth, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": budget, "max_tokens": 48, "temperature": 0.0 if i % 3 else 1.0,
            "seed": i, "kv_cache_dtype": list(KV_CACHE_DTYPES)[i % len(KV_CACHE_DTYPES)],
            "block_size": (8, 16, 32)[i % 3]}


def test_thirty_two_tree_sessions_at_once_leave_no_kv_block_behind(tree_server):
    async def scenario():
        # max_queue=None: a client that stops reading keeps the close handshake possible (see test_ws_api's disconnects)
        clients = [Client(await websockets.connect(ws_url(tree_server), open_timeout=10, max_queue=None))
                   for _ in range(SESSIONS)]
        for i, c in enumerate(clients):                    # paused: each runs only the rounds it is stepped
            await c.send(type="start", prompt=PROMPT + str(i), settings=settings(i), paused=True)
        for c in clients:
            assert ((await c.until("state", timeout=120))["round"]) == 0
            for round_no in (1, 2):                        # the prefill, then one drafting round
                await c.send(type="step")
                state = await c.until("state", timeout=120)
                assert (state["state"], state["round"]) == ("paused", round_no), state
        busy = get_json(tree_server + "/api/stats")
        assert busy["sessions"] == SESSIONS and busy["kv_blocks_used"] > 0, busy
        drafts = [m for c in clients for m in c.seen if m["type"] == "draft"]
        heads = [m["tree"] for m in drafts if m["method"] != "ngram"]   # a lookup with one match drafts a chain
        assert all(t and t["topk"] > 1 for t in heads) and {t["num_draft_tokens"] for t in heads} == {8, 16}
        ends = {"stopped": clients[0::4], "closed": clients[1::4], "vanished": clients[2::4], "done": clients[3::4]}
        for c in ends["stopped"]:
            await c.send(type="stop")
        for c in ends["closed"]:
            await c.ws.close()
        for c in ends["vanished"]:
            c.ws.transport.abort()                         # no close frame, as when a laptop lid shuts
        for c in ends["done"]:
            await c.send(type="resume")                       # at full speed (no speed was set)
        results = await asyncio.gather(*(c.until("done", timeout=120) for c in ends["stopped"] + ends["done"]))
        assert [r["finish_reason"] for r in results[:len(ends["stopped"])]] == ["cancelled"] * len(ends["stopped"])
        assert all(r["finish_reason"] in ("length", "stop") for r in results[len(ends["stopped"]):]), results
        for c in ends["stopped"] + ends["done"]:
            await c.ws.close()

    run(scenario(), timeout=300)
    stats = wait_for_stats(tree_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0, timeout=30)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0 and stats["kv_blocks_total"] > 0, stats
