"""Generation on an OpenAI-compatible streaming server (llama.cpp's server, vLLM, SGLang), as our events.

    engine = ExternalEngine("llama.cpp · SmolLM2-135M Q4_1", "http://127.0.0.1:PORT/v1", ...)
    async for event in stream_chat(engine, prompt, settings):   # Started, Prefill, TokenResult, RoundDone,
        ...                                                      # Metrics, ..., then Done or Error

The server's URL comes from the operator's configuration only (an `ExternalEngine`); nothing here takes a
URL from a client. Every answer is bounded: connect, per-read stall and total timeouts, a maximum line and
event size, a maximum error body. Server-sent events are parsed strictly (text/event-stream, JSON objects,
ended by `data: [DONE]`); anything else ends the generation with an `Error` that says what came.

Timings are measured where the chunks are received (TTFT, ITL, tokens/s); the engine's own figures, where it
reports them (llama.cpp's `timings`, `usage`, vLLM's `metrics`), go beside them under `engine_*` keys.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator

import httpx

from ..serving.events import Done, Error, Event, Metrics, Prefill, RoundDone, SettingsApplied, Started, TokenResult
from ..serving.settings import MAX_PROMPT_CHARS, GenerationSettings, SettingsError
from .vllm_rounds import StepRules, reconcile, step_tokens, stream_figures

# Our settings that describe our engine's internals; a server has them fixed at its start-up.
SERVER_SETTINGS = ("method", "num_speculative_tokens", "num_speculative_tokens_schedule", "rejection_sample_method",
                   "draft_confidence_threshold",
                   "prompt_lookup_min",
                   "prompt_lookup_max", "kv_cache", "kv_cache_dtype", "num_kv_heads", "block_size",
                   "enable_prefix_caching", "fault")


@dataclass(frozen=True)
class StreamLimits:
    connect_s: float = 5.0
    stall_s: float = 30.0           # longest wait for the next bytes of an answer
    total_s: float = 600.0          # a whole generation (checked whenever bytes arrive)
    max_line_bytes: int = 256 * 1024
    max_error_bytes: int = 4096     # of an error answer's body, quoted in the error


@dataclass(frozen=True)
class ExternalEngine:
    """An OpenAI-compatible server the operator configured. `base_url` ends before `/chat/completions`."""
    name: str                       # what a client picks (the model selector's label)
    base_url: str
    model: str | None = None        # the request's "model" field (None: the server's only model)
    metrics_url: str | None = None  # Prometheus text (vLLM's and llama.cpp's /metrics)
    api_key: str | None = field(default=None, repr=False)
    kind: str = "openai"            # llamacpp: llama.cpp's server (timings_per_token, draft counts); vllm: token ids
    description: dict = field(default_factory=dict)   # what the model list shows (threads, file, ...)
    limits: StreamLimits = StreamLimits()
    rules: StepRules | None = field(default=None, repr=False, compare=False)  # vLLM: its steps (vllm_rounds)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def describe(self) -> dict:
        return {"name": self.name, "role": "target", "external": True, "engine": self.kind,
                "chat": True, **self.description}


class EngineFault(Exception):
    """The server's answer cannot be used (HTTP error, not SSE, malformed event, too large, too slow)."""


def validated(prompt: str | None, settings: dict) -> GenerationSettings:
    """The settings of a generation on an external engine (its name in "model" is the caller's business);
    the same bounds as our own generations (SettingsError)."""
    if not prompt:
        raise SettingsError("prompt", "must not be empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SettingsError("prompt", f"at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")
    return GenerationSettings.parse({k: v for k, v in settings.items() if k != "model"})


def chat_request(engine: ExternalEngine, prompt: str, s: GenerationSettings) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed,
            "stream_options": {"include_usage": True}}
    if engine.model:
        body["model"] = engine.model
    if engine.kind == "llamacpp":
        body["timings_per_token"] = True
    if engine.kind == "vllm":
        body["return_token_ids"] = True          # each chunk's token ids: one engine step (vllm_rounds)
    return body


def inapplicable_notes(engine: ExternalEngine, sent: dict) -> list[str]:
    """One line naming the settings the client sent that this server cannot take per request."""
    names = [k for k in sent if k in SERVER_SETTINGS]
    return [f"set by the server at start-up ({engine.name}), not applied: {', '.join(names)}"] if names else []


async def sse_events(response: httpx.Response, limits: StreamLimits, deadline: float) -> AsyncIterator[str]:
    """The `data` of each server-sent event, until `[DONE]` (which ends it). Comments and other fields are
    skipped, as the SSE specification says; a line over `max_line_bytes`, the total deadline, or the end of
    the stream before `[DONE]` raise EngineFault."""
    buffer = b""
    data: list[str] = []
    async for chunk in response.aiter_bytes():
        if time.monotonic() > deadline:
            raise EngineFault(f"no end after {limits.total_s:g} s (total timeout)")
        buffer += chunk
        *lines, buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        if len(buffer) > limits.max_line_bytes:
            raise EngineFault(f"a line of the event stream is over {limits.max_line_bytes} bytes")
        for raw in lines:
            if len(raw) > limits.max_line_bytes:
                raise EngineFault(f"a line of the event stream is over {limits.max_line_bytes} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise EngineFault("the event stream is not UTF-8") from None
            if line == "":
                if data:
                    text, data = "\n".join(data), []
                    if text == "[DONE]":
                        return
                    yield text
            elif line.startswith("data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(" ") else value)
                if sum(map(len, data)) > limits.max_line_bytes:
                    raise EngineFault(f"an event of the stream is over {limits.max_line_bytes} bytes")
    raise EngineFault("the stream ended before data: [DONE]")


def _chunk(text: str) -> dict:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise EngineFault(f"an event is not JSON: {text[:80]!r}") from None
    if not isinstance(obj, dict):
        raise EngineFault(f"an event is not a JSON object: {text[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        raise EngineFault(f"the server reported an error: {str(err.get('message', err) if isinstance(err, dict) else err)[:300]}")
    choices = obj.get("choices", [])
    if not isinstance(choices, list) or any(not isinstance(c, dict) for c in choices):
        raise EngineFault(f"an event's choices is not a list of objects: {text[:80]!r}")
    return obj


def _number(d: dict, key: str) -> float | None:
    v = d.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


async def _check_answer(response: httpx.Response, limits: StreamLimits, deadline: float) -> None:
    if response.status_code != 200:
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= limits.max_error_bytes or time.monotonic() > deadline:
                break
        text = body[:limits.max_error_bytes].decode("utf-8", "replace").strip()
        raise EngineFault(f"HTTP {response.status_code}: {text[:300] or response.reason_phrase}")
    ctype = response.headers.get("content-type", "")
    if not ctype.startswith("text/event-stream"):
        raise EngineFault(f"expected text/event-stream, got {ctype or 'no content type'!r}")


async def stream_chat(engine: ExternalEngine, prompt: str, settings: dict,
                      client: httpx.AsyncClient | None = None) -> AsyncIterator[Event]:
    """One chat generation on `engine`, as our events: Started, a SettingsApplied note for settings that
    cannot apply, per received chunk its tokens (status "target"), a RoundDone and Metrics, then Done or
    Error. Errors of the server or the network are an `Error` event, never an exception."""
    s = validated(prompt, settings).model_copy(update={"chat": True})   # its chat endpoint applies the template
    limits = engine.limits
    session_id = uuid.uuid4().hex[:12]
    rules = engine.rules
    prompt_tokens = rules.prompt_tokens(prompt) if rules is not None and rules.prompt_tokens else []
    yield Started(session_id, {**s.model_dump(), "model": engine.name}, engine.describe(), None, prompt_tokens)
    notes = inapplicable_notes(engine, settings)
    if notes:
        yield SettingsApplied({}, notes)
    own = client is None                 # a client handed in keeps its connections for the next run
    timeout = httpx.Timeout(limits.stall_s, connect=limits.connect_s)
    if own:
        client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
    t0 = time.perf_counter()
    deadline = time.monotonic() + limits.total_s
    stats = _Received(t0, engine.rules)
    try:
        async with client.stream("POST", engine.base_url.rstrip("/") + "/chat/completions",
                                 json=chat_request(engine, prompt, s), headers=engine.headers(),
                                 timeout=timeout) as response:
            await _check_answer(response, limits, deadline)
            async for text in sse_events(response, limits, deadline):
                for event in stats.take(_chunk(text)):
                    yield event
    except EngineFault as e:
        yield Error(f"{engine.name}: {e}")
        return
    except httpx.TimeoutException as e:
        what = "connect" if isinstance(e, httpx.ConnectTimeout) else "stall"
        secs = limits.connect_s if what == "connect" else limits.stall_s
        yield Error(f"{engine.name}: nothing received for {secs:g} s ({what} timeout)")
        return
    except httpx.HTTPError as e:
        yield Error(f"{engine.name}: cannot reach the server ({type(e).__name__}: {str(e)[:200]})")
        return
    finally:
        if own:
            await client.aclose()
    yield Done(stats.summary(engine, s))


class _Received:
    """What the chunks said, and when they arrived."""

    def __init__(self, t0: float, rules: StepRules | None = None):
        self.t0 = t0
        self.rules, self.steps = rules, rules.new() if rules else None
        self.tokens: list[dict] = []     # vLLM: {id, text, status} of each token
        self.arrivals: list[float] = []
        self.texts: list[str] = []
        self.round = 0
        self.finish_reason: str | None = None
        self.timings: dict = {}
        self.usage: dict = {}
        self.engine_metrics: dict = {}
        self.drafts = [0, 0]             # draft tokens, accepted draft tokens (llama.cpp's cumulative counts)
        self.num_prompt_tokens: int | None = None     # the server's count (vLLM's prompt_token_ids)
        self.prefill_sent = False

    def take(self, obj: dict) -> list[Event]:
        now = time.perf_counter()
        events: list[Event] = []
        timings = obj.get("timings")
        if isinstance(timings, dict):
            if not self.prefill_sent and _number(timings, "prompt_n") is not None:
                self.prefill_sent = True
                events.append(Prefill("target", int(timings["prompt_n"]), int(_number(timings, "cache_n") or 0),
                                      float(_number(timings, "prompt_ms") or 0.0)))
            drafted = (_number(timings, "draft_n") or 0) - (_number(self.timings, "draft_n") or 0)
            accepted = (_number(timings, "draft_n_accepted") or 0) - (_number(self.timings, "draft_n_accepted") or 0)
            self.timings = timings
        else:
            drafted = accepted = 0
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("metrics"), dict):                 # vLLM --per-request-spec-decode-metrics
            self.engine_metrics = obj["metrics"]
        texts, ids = [], []
        if self.steps is not None and isinstance(obj.get("prompt_token_ids"), list):
            self.steps.prompt([int(t) for t in obj["prompt_token_ids"] if isinstance(t, int)])
            self.num_prompt_tokens = len(self.steps.context)
        for choice in obj.get("choices", []):
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if content is not None and not isinstance(content, str):
                raise EngineFault(f"delta.content is not text: {str(content)[:80]!r}")
            if content:
                texts.append(content)
            token_ids = choice.get("token_ids")
            if token_ids is not None:
                if not isinstance(token_ids, list) or not all(isinstance(t, int) and t >= 0 for t in token_ids):
                    raise EngineFault(f"token_ids is not a list of token ids: {str(token_ids)[:80]!r}")
                ids += token_ids
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        if self.steps is not None:
            return events + self._step(ids, "".join(texts), now) if ids else events
        if not texts and drafted <= 0:        # a draft verified in a chunk without text still makes a round
            return events
        self.round += 1
        for i, text in enumerate(texts, 1):
            events.append(TokenResult(self.round, i, -1, text, "target", None, None, None, None))
        self.texts += texts
        gap_ms = (now - (self.arrivals[-1] if self.arrivals else self.t0)) * 1e3
        self.arrivals += [now] * len(texts)
        if drafted > 0:
            self.drafts[0] += int(drafted)
            self.drafts[1] += int(accepted)
        events.append(RoundDone(self.round, int(max(drafted, 0)), int(max(accepted, 0)), len(texts),
                                1 + int(max(drafted, 0)), 0.0, 0.0, gap_ms))
        events.append(Metrics(self.figures()))
        return events

    def _step(self, ids: list[int], text: str, now: float) -> list[Event]:
        """A vLLM chunk: one engine step's tokens, its drafts and acceptances (vllm_rounds)."""
        self.round += 1
        events, step = step_tokens(self.rules, self.steps, self.round, ids, text)
        self.texts.append(text)
        self.tokens += [{"id": e.id, "text": e.text, "status": e.status} for e in events]
        gap_ms = (now - (self.arrivals[-1] if self.arrivals else self.t0)) * 1e3
        self.arrivals += [now] * len(ids)
        self.drafts[0] += step.drafted
        self.drafts[1] += step.accepted
        return events + [RoundDone(self.round, step.drafted, step.accepted, len(ids), step.drafted + 1, 0.0, 0.0,
                                   gap_ms), Metrics(self.figures())]

    def vllm_summary(self) -> dict:
        """vLLM's own per-request figures (its per-step lists) where it sent them, reconciled with the stream."""
        rounds = reconcile(self.steps.steps, self.engine_metrics, self.rules.gamma)
        own = rounds["reconciled"]
        return {"vllm_rounds": rounds, "num_drafts": own["num_drafts"],
                "mean_acceptance_length": own["mean_acceptance_length"],
                "accepted_per_position": own["accepted_per_position"],
                "num_draft_tokens": own["num_draft_tokens"], "num_accepted_tokens": own["num_accepted_tokens"],
                "acceptance_rate": own["acceptance_rate"]} if self.rules.method else {"vllm_rounds": None}

    def _num_prompt_tokens(self) -> int | None:
        """The prompt's tokens as the server counted them (vLLM's ids, else its usage), None where it did not say."""
        usage = _number(self.usage, "prompt_tokens")
        return self.num_prompt_tokens if self.num_prompt_tokens is not None else None if usage is None else int(usage)

    def figures(self) -> dict:
        n = len(self.arrivals)
        elapsed = (self.arrivals[-1] - self.t0) if n else 0.0
        ttft = (self.arrivals[0] - self.t0) if n else None
        itl = (self.arrivals[-1] - self.arrivals[0]) / (n - 1) * 1e3 if n > 1 else None
        num_draft_tokens, num_accepted = self.drafts
        t = self.timings
        return {
            "num_output_tokens": n, "elapsed_s": elapsed, "ttft_s": ttft,
            "ttft_ms": ttft * 1e3 if ttft is not None else None, "itl_ms": itl,
            "tokens_per_s": n / elapsed if elapsed else None,
            # llama.cpp's counts arrive with the chunks; a chunk may cover more than one draft, so the number
            # of drafts (and the mean acceptance length) is on its /metrics only
            "num_draft_tokens": num_draft_tokens, "num_accepted_tokens": num_accepted,
            "acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else None,
            # the engine's own clock, beside ours
            "engine_ttft_ms": _number(t, "prompt_ms"),
            "engine_itl_ms": _number(t, "predicted_per_token_ms"),
            "engine_tokens_per_s": _number(t, "predicted_per_second"),
            **(stream_figures(self.steps) if self.steps is not None else {}),
        }

    def summary(self, engine: ExternalEngine, s: GenerationSettings) -> dict:
        """The fields of our own summary (contracts: `generate --json`); what a server does not tell is None."""
        n, f = len(self.arrivals), self.figures()
        return {"text": "".join(self.texts), "finish_reason": self.finish_reason,
                "num_drafts": None, "mean_acceptance_length": None, "accepted_per_position": [],
                "target_forward_calls": None, "draft_forward_calls": None, "kv_cache": None,
                "tpot_s": (f["elapsed_s"] - f["ttft_s"]) / (n - 1) if n > 1 else None,
                "tokens": self.tokens or [{"id": -1, "text": x, "status": "target"} for x in self.texts],
                **f, **(self.vllm_summary() if self.steps is not None else {}), "engine_timings": self.timings,
                "engine_usage": self.usage, "num_prompt_tokens": self._num_prompt_tokens(),
                "engine_metrics": self.engine_metrics, "model": engine.describe(), "draft_model": None,
                "settings": {**s.model_dump(), "model": engine.name}}


API_KEY_ENV = "DECODING_PLAYGROUND_OPENAI_API_KEY"


def run_coroutine(coro):
    """`coro` run to its end from synchronous code (a bench's, a cross-check's): in a thread of its own where this
    thread already runs an event loop (a caller inside one, e.g. a browser test's), where asyncio.run refuses."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def configured_engines(specs: tuple[dict, ...], env=None) -> list[ExternalEngine]:
    """ExternalEngines from `serve --openai-url URL [--openai-model NAME] [--openai-metrics-url URL]` (each a
    dict: url, and optionally model, metrics_url, name, connect_s, stall_s, total_s). Only http(s) URLs; the
    API key comes from the environment, never from the command line."""
    env = os.environ if env is None else env
    engines = []
    for spec in specs:
        url = spec["url"].rstrip("/")
        for key in ("url", "metrics_url"):
            value = spec.get(key)
            if value is not None and not value.startswith(("http://", "https://")):
                raise ValueError(f"--openai-{key.replace('_', '-')}: an http:// or https:// URL, got {value!r}")
        name = spec.get("name") or f"{spec.get('model') or 'server'} · {url.split('://', 1)[1].split('/', 1)[0]}"
        limits = StreamLimits(**{k: spec[k] for k in ("connect_s", "stall_s", "total_s") if k in spec})
        engines.append(ExternalEngine(name, url, spec.get("model"), spec.get("metrics_url"),
                                      env.get(API_KEY_ENV) or None, "openai", {"server": "OpenAI-compatible"},
                                      limits))
    return engines
