"""The prompt tokens of a run on vLLM, on the page: `started` carries them as our tokenizer reads the prompt with
the chat template (vLLM sends its own only with its first token), so the run's first note gives their count, not
0; at the end the server's own count is noted where it differs. Against a vLLM-shaped stream on loopback
(tests/hostile_engine.py's `vllm`: 37 prompt ids), rendered by the page's view; the live check that ours are
vLLM's is tests/e2e/vllm_live/test_cross_checks.py's."""
import asyncio
import concurrent.futures
import html
import re

import pytest
from hostile_engine import HostileEngine

from app.protocol import Batch, RenderContext
from app.views.html import HtmlView
from app.ws.vllm import step_rules
from engine.external.openai_stream import ExternalEngine, stream_chat
from engine.model.chat import ChatTemplate
from engine.model.tokenizer import TextTokenizer

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def hostile():
    with HostileEngine() as server:
        yield server


def chat_tokenizer() -> TextTokenizer:
    """A character tokenizer with SmolLM2's chat format (every character of the rendered prompt in its vocabulary)."""
    text = ChatTemplate("chatml", "You are a helpful AI assistant").prompt(PROMPT)
    return TextTokenizer(TextTokenizer.char_level(text).tokenizer, {"chat_format": "chatml",
                                                                    "default_system_prompt": "You are a helpful AI assistant"})


def events_of(engine: ExternalEngine) -> list:
    async def collect():
        return [e async for e in stream_chat(engine, PROMPT, {"max_tokens": 3})]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, collect()).result()


def notes(messages: list[str]) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).strip() for text in messages
            for m in re.findall(r'<li[^>]*class="note[^"]*"[^>]*>.*?</li>', text, re.S)]


def test_a_vllm_runs_first_note_counts_its_prompt_tokens_and_the_end_notes_vllms_count(hostile):
    tokenizer = chat_tokenizer()
    engine = ExternalEngine("vLLM · test", hostile.url("vllm"), kind="vllm", rules=step_rules("plain", tokenizer))
    events = events_of(engine)
    started, done = events[0], events[-1]
    rendered = ChatTemplate("chatml", "You are a helpful AI assistant").prompt(PROMPT)
    assert [t["id"] for t in started.prompt_tokens] == tokenizer.encode(rendered)
    assert "".join(t["text"] for t in started.prompt_tokens if not t.get("template")) == PROMPT
    assert done.type == "done" and done.summary["num_prompt_tokens"] == 37            # vLLM's own ids
    view = HtmlView()
    ctx = RenderContext(1, state="running")
    said = notes(view.render([Batch(1, events[:1])], ctx)) + notes(view.render([Batch(1, events[1:])], ctx))
    assert said[0] == f"new run on vLLM · test: {len(rendered)} prompt tokens, seed 0", said
    assert f"the server's prompt: 37 tokens (shown: {len(rendered)}, our tokenizer's)" in said, said


def test_a_server_without_our_tokenizer_is_said_to_tokenize_the_prompt(hostile):
    engine = ExternalEngine("server · test", hostile.url("vllm"), kind="vllm")
    events = events_of(engine)
    assert events[0].prompt_tokens == []
    view, ctx = HtmlView(), RenderContext(1, state="running")
    said = notes(view.render([Batch(1, events)], ctx))
    assert said[0] == "new run on server · test: the server tokenizes the prompt, seed 0", said
    assert "the server's prompt: 37 tokens" in said, said
