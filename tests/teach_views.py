"""What the teaching views' tests (tests/test_teach.py, tests/test_teach_runs.py) share: an app on the character
models, a sampled run as the live page showed it, and readers of the rendered HTML. The fixtures are imported by
name into each test module."""
from __future__ import annotations

import re
from html import unescape

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig
from app.main import create_app
from app.protocol import Batch, RenderContext
from app.views.html import HtmlView
from app.views.replay import rounds_of
from engine.serving.session import GenerationSession

PROMPT = "def parse(line):\n    "
TOKEN_RE = re.compile(r'<span class="tok[^"]*" data-token-status="(\w+)"[^>]*>(.*?)</span>', re.S)


@pytest.fixture(scope="module")
def client(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        yield c


@pytest.fixture(scope="module")
def engine(client):
    return client.app.state.playground.engine


RUNNING = RenderContext(run_id=1, state="running")     # what the view knows of its connection


def show_run(view: HtmlView, events) -> list[str]:
    """What the page's connection does with a run: its rounds rendered one message each."""
    out = []
    for chunk in rounds_of(events):
        out += view.render([Batch(1, chunk)], RUNNING)
    return out


def run_events(engine, **settings):
    settings = {"max_tokens": 40, "method": "draft_model", "num_speculative_tokens": 3, **settings}
    return list(GenerationSession(engine, PROMPT, settings).events())


@pytest.fixture(scope="module")
def recorded(client, engine):
    """A sampled run as the live page showed it, and the view that recorded it."""
    view = client.app.state.playground.view("html")
    view.form_prompt = PROMPT
    events = run_events(engine, temperature=1.0, seed=3, max_tokens=120)
    messages = show_run(view, events)
    return view.recording, events, messages


def tokens_of(messages) -> list[tuple[str, str]]:
    return [(s, unescape(t)) for m in messages for s, t in TOKEN_RE.findall(m)]



def figure(html: str, name: str) -> str:
    m = re.search(rf'data-figure="{name}"[^>]*>([^<]*)<', html)
    assert m, name
    return m.group(1)

