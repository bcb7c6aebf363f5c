"""Links and messages that keep working (issue 32, item 2), on real servers with and without SmolLM2.

A setting left out takes a value the chosen model can run; a link asking for a method gets a model that can do it
(our own when SmolLM2 cannot, said in one line); nothing a link or program named is changed. Old-style links
(`/?prompt=...&method=...`, written before SmolLM2 became the page's default) on the page, /embed and /watch, and
`start` messages on /api/ws and /ws without `model` or with SmolLM2's, for each method. The page's links are also
played: the form as the page renders it goes to /ws, and the run must start and finish.
"""
from __future__ import annotations

import json
import os
import re
from html import unescape
from unittest import mock
from urllib.request import urlopen

import pytest
import websockets

from engine.model.threads import threads
from engine.spec_decode.heads import demo_settings
from live_server import serve
from test_page import Form
from ws_client import connect, run, ws_url
from test_ws_html import HtmlClient, status_is

SMOLLM2 = "smollm2-135m"
METHODS = ("none", "draft_model", "ngram", "eagle", "medusa")
OLD_LINK = "?prompt=def%20__init__(self,%20&method={method}&autoplay=1&max_tokens=4"


@pytest.fixture(scope="module")
def with_smollm2(smollm2_dir, models_dir):
    from app.config import AppConfig
    from app.main import create_app

    with serve(create_app(AppConfig(models_dir=models_dir))) as url:           # demo "auto": the page opens on it
        yield url


@pytest.fixture(scope="module")
def without_smollm2(models_dir, tmp_path_factory):
    from app.config import AppConfig
    from app.main import create_app

    with mock.patch.dict(os.environ, {"DECODING_PLAYGROUND_CACHE": str(tmp_path_factory.mktemp("empty-cache"))}):
        with serve(create_app(AppConfig(models_dir=models_dir))) as url:
            models = json.loads(urlopen(url + "/api/models", timeout=10).read())["models"]
            assert SMOLLM2 not in {m["name"] for m in models}
            yield url


def page(url: str) -> tuple[dict, list[str], list[str]]:
    """The form's values, the warnings and the notes of a page."""
    html = urlopen(url, timeout=30).read().decode()
    banners = lambda kind: [unescape(t) for t in re.findall(rf'<div class="{kind}"[^>]*>(.*?)</div>', html, re.S)]
    return Form(html).values, banners("warning-banner"), banners("note-banner")


def play(base: str, form: dict) -> dict:
    """The form sent to /ws as the page's play button does: the run's `started` settings and how it ended."""
    async def scenario():
        async with websockets.connect(ws_url(base, "/ws"), open_timeout=10, max_size=2 ** 24) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await ws.send(json.dumps({**form, "speed": "max", "max_tokens": "4", "action": "toggle"}))
            end = await c.until(lambda f: status_is("done")(f) or 'data-note="error"' in f.raw, timeout=240)
            return end.raw
    return run(scenario(), timeout=300)


@pytest.mark.parametrize("path", ["/", "/embed", "/watch/0123456789abcdef"])
@pytest.mark.parametrize("method", METHODS)
def test_an_old_link_asking_for_a_method_opens_on_a_model_that_can_with_smollm2(with_smollm2, path, method):
    form, warnings, notes = page(with_smollm2 + path + OLD_LINK.format(method=method))
    assert form["method"] == method and form["prompt"] == "def __init__(self, " and not warnings, (form, warnings)
    assert form["model"] == SMOLLM2 and not notes, (form, notes)         # SmolLM2 runs every method, its draft model too
    if path == "/":
        end = play(with_smollm2, form)
        assert 'data-state="done"' in end and 'data-note="error"' not in end, end[-500:]


@pytest.mark.parametrize("path", ["/", "/embed", "/watch/0123456789abcdef"])
@pytest.mark.parametrize("method", METHODS)
def test_an_old_link_opens_on_our_models_without_smollm2(without_smollm2, path, method):
    form, warnings, notes = page(without_smollm2 + path + OLD_LINK.format(method=method))
    assert form["method"] == method and form["model"] == "" and not warnings and not notes, (form, warnings, notes)
    if path == "/":
        end = play(without_smollm2, form)
        assert 'data-state="done"' in end and 'data-note="error"' not in end, end[-500:]


def test_a_link_naming_smollm2_and_its_draft_model_opens_with_both(with_smollm2):
    form, warnings, notes = page(with_smollm2 + "/?model=smollm2-135m&method=draft_model")
    assert form["model"] == SMOLLM2 and form["method"] == "draft_model" and not notes and not warnings, form


def demo_drafting() -> tuple[int, float]:
    """SmolLM2's EAGLE setting as `bench heads` last measured it for the servers' thread count (demo.json)."""
    d = demo_settings(SMOLLM2, threads())
    return d["num_speculative_tokens"], d["draft_confidence_threshold"]


def test_a_link_without_settings_opens_on_each_servers_default_demo(with_smollm2, without_smollm2):
    form, warnings, notes = page(with_smollm2 + "/")
    assert (form["model"], form["method"], form["num_speculative_tokens"], form["chat"]) == (
        SMOLLM2, "eagle", str(demo_drafting()[0]), "true") and not warnings and not notes
    form, warnings, notes = page(without_smollm2 + "/")
    assert (form["model"], form["method"], form["num_speculative_tokens"]) == ("", "draft_model", "4")


# --- programs: /api/ws ---------------------------------------------------------------------------------------------
def start(base: str, settings: dict, path: str = "/api/ws") -> list[dict]:
    """A `start` with these settings: what came back, up to `done` or an error."""
    async def scenario():
        async with connect(base, path) as c:
            await c.send(type="start", prompt="Hi", settings={**settings, "max_tokens": 3})
            await c.until("done", "error", timeout=240)
            return c.seen
    return run(scenario(), timeout=300)


@pytest.mark.parametrize("model", [None, SMOLLM2])
@pytest.mark.parametrize("method", [None, *METHODS])
@pytest.mark.parametrize("smollm2", [True, False], ids=["with-smollm2", "without-smollm2"])
def test_api_start_messages_with_and_without_model_for_each_method(request, smollm2, model, method):
    base = request.getfixturevalue("with_smollm2" if smollm2 else "without_smollm2")
    settings = {k: v for k, v in (("model", model), ("method", method)) if v is not None}
    seen = start(base, settings)
    end = seen[-1]
    if model == SMOLLM2 and not smollm2:
        assert end["type"] == "error" and end["setting"] == "model" and "unknown model" in end["message"], end
        return
    started = next(m for m in seen if m["type"] == "started")
    assert end["type"] == "done", end
    expected_model = SMOLLM2 if model == SMOLLM2 else "target-mha"          # none named: our MHA target, as documented
    expected_method = method or ("eagle" if model == SMOLLM2 else "draft_model")
    assert started["model"]["name"] == expected_model and started["settings"]["method"] == expected_method, started
    drafting = started["settings"]["num_speculative_tokens"], started["settings"]["draft_confidence_threshold"]
    assert drafting == (demo_drafting() if model == SMOLLM2 else (4, 0.0)), drafting    # SmolLM2's head's measured best
    settings = {**settings, "num_speculative_tokens": 2, "draft_confidence_threshold": 0.25}
    if model == SMOLLM2 and method is None:                   # what a program names is kept, the rest filled in
        started = next(m for m in start(base, settings) if m["type"] == "started")
        assert started["settings"]["method"] == "eagle" and started["settings"]["num_speculative_tokens"] == 2
        assert started["settings"]["draft_confidence_threshold"] == 0.25
    assert not any(m["type"] == "note" and m["kind"] == "model_chosen" for m in seen)


def test_a_program_asking_for_a_chat_template_without_a_model_gets_one_that_has_it(with_smollm2, without_smollm2):
    seen = start(with_smollm2, {"chat": True})
    note = next(m for m in seen if m["type"] == "note" and m["kind"] == "model_chosen")
    assert "chat=true" in note["text"] and SMOLLM2 in note["text"]
    assert next(m for m in seen if m["type"] == "started")["model"]["name"] == SMOLLM2 and seen[-1]["type"] == "done"
    end = start(without_smollm2, {"chat": True})[-1]
    assert end["type"] == "error" and end["setting"] == "chat", end


# --- the page's websocket: the same form, fields left out -------------------------------------------------------------
@pytest.mark.parametrize("fields", [{"model": SMOLLM2}, {"method": "draft_model"}, {"method": "eagle"},
                                    {"model": SMOLLM2, "method": "ngram"}, {}])
def test_ws_form_messages_leaving_settings_out_run(with_smollm2, fields):
    async def scenario():
        async with websockets.connect(ws_url(with_smollm2, "/ws"), open_timeout=10, max_size=2 ** 24) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await ws.send(json.dumps({"action": "toggle", "prompt": "Hi", "max_tokens": "3", "speed": "max", **fields}))
            await c.until(lambda f: status_is("done")(f) or 'data-note="error"' in f.raw, timeout=240)
            return "".join(f.raw for f in c.messages)

    text = run(scenario(), timeout=300)
    assert 'data-note="error"' not in text and 'data-state="done"' in text, text[-600:]
    model = fields.get("model", "target-mha")
    assert re.search(rf'id="model-info"[^>]*>{model}:', text), re.findall(r'id="model-info"[^>]*>[^<]*', text)
    method = fields.get("method") or ("eagle" if model == SMOLLM2 else "draft_model")
    assert f"{method.replace('_', ' ')}, seed 0" in text
