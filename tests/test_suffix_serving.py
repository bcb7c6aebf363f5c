"""Suffix decoding on a real server: `/api/ws` takes `method: "suffix"`, a question asked again drafts from the
first answer, `/metrics` gauges the global trees, `serve --suffix-cache session` keeps each page's runs to itself,
and bad values are errors naming the setting or option. Real uvicorn servers of their own (tests/live_server.py):
the global trees are the server's, so no other test's runs may reach them."""
from __future__ import annotations

import re
import urllib.request
from contextlib import contextmanager

import pytest
from ws_client import connect, run

PROMPT = "def add(a, b):\n    return a + b\n\ndef"
SETTINGS = {"model": "target-mha", "method": "suffix", "max_tokens": 60, "num_speculative_tokens": 8}


@contextmanager
def server(models_dir, **config):
    from app.config import AppConfig
    from app.main import create_app
    from live_server import serve

    with serve(create_app(AppConfig(models_dir=models_dir, demo="character", **config))) as base_url:
        yield base_url


def gauge(base_url: str, name: str, model: str = "target-mha") -> float | None:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    m = re.search(rf'^{re.escape(name)}\{{model_name="{model}"\}} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else None


async def one_run(c, settings=SETTINGS) -> tuple[list[dict], dict]:
    """A run on an open connection: its draft events and its done."""
    start = len(c.seen)
    await c.send(type="start", prompt=PROMPT, settings=settings)
    done = await c.until("done", "error")
    assert done["type"] == "done", done
    return [m for m in c.seen[start:] if m["type"] == "draft"], done


def drafted(drafts) -> list[list[int]]:
    return [[t["id"] for t in d["tokens"]] for d in drafts]


def test_a_question_asked_again_drafts_from_the_first_answer_and_metrics_gauge_the_tree(models_dir):
    with server(models_dir) as base_url:
        assert gauge(base_url, "playground_suffix_decoding_tree_nodes") is None       # nothing cached yet

        async def scenario():
            async with connect(base_url) as first, connect(base_url) as second:       # two people, one room
                drafts, done = await one_run(first)
                assert done["settings"]["method"] == "suffix"
                again, done_again = await one_run(second)
            assert done_again["text"] == done["text"]
            assert done_again["mean_acceptance_length"] > done["mean_acceptance_length"]
            for d in drafts + again:
                o = d["origin"]
                assert o["source"] in ("request", "earlier_requests") and o["match_len"] >= 1
                assert len(o["probs"]) == len(d["tokens"]) and abs(o["score"] - sum(o["probs"])) < 1e-5
            assert any(d["origin"]["source"] == "earlier_requests" for d in again)

        run(scenario())
        assert gauge(base_url, "playground_suffix_decoding_cached_requests") == 2
        assert gauge(base_url, "playground_suffix_decoding_tree_nodes") > 0
        with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
            assert "playground_suffix_decoding_max_tree_nodes 1e+06" in response.read().decode()


def test_suffix_cache_session_keeps_each_page_to_its_own_earlier_runs(models_dir):
    with server(models_dir, suffix_cache="session") as base_url:
        async def scenario():
            key_a, key_b = "page-a-0123456789", "page-b-0123456789"
            async with connect(base_url, "/api/ws?key=" + key_a) as a:
                first, _ = await one_run(a)
                async with connect(base_url, "/api/ws?key=" + key_b) as b:
                    other, _ = await one_run(b)
                    assert drafted(other) == drafted(first)          # b drafts as if nothing had been cached
                again, _ = await one_run(a)
                assert drafted(again) != drafted(first)              # a drafts from its own first answer
            assert gauge(base_url, "playground_suffix_decoding_tree_nodes") is None   # both pages gone

        run(scenario())


def test_suffix_settings_out_of_range_are_error_events(live_server):
    async def scenario():
        async with connect(live_server) as c:
            await c.send(type="start", prompt=PROMPT, settings={**SETTINGS, "suffix_decoding_min_token_prob": 2})
            error = await c.until("error")
            assert error["message"] == "suffix_decoding_min_token_prob: must be in [0.0, 1.0] (got 2)"
            drafts, done = await one_run(c)                        # the connection goes on
            assert drafts and done["settings"]["suffix_decoding_min_token_prob"] == 0.1

    run(scenario())


@pytest.mark.parametrize("args, message", [
    (["--suffix-cache", "room"], "--suffix-cache: invalid choice: 'room' (choose from 'shared', 'session')"),
    (["--suffix-decoding-max-tree-nodes", "0"], "--suffix-decoding-max-tree-nodes: 1 to 100000000, got 0")])
def test_serve_refuses_a_bad_suffix_option_in_one_line(args, message, capsys):
    from cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["serve", *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_the_suffix_cache_variable_is_checked_like_the_option():
    from app.config import AppConfig, ConfigError

    assert AppConfig.from_env({"DECODING_PLAYGROUND_SUFFIX_CACHE": "session"}).suffix_cache == "session"
    with pytest.raises(ConfigError, match="suffix_cache: shared or session, got 'room'"):
        AppConfig.from_env({"DECODING_PLAYGROUND_SUFFIX_CACHE": "room"})
