"""What an inference server publishes about itself: its Prometheus `/metrics`, read for the gauges (KV usage,
requests, prefix-cache hits, speculative counts: vLLM's `vllm:*`, llama.cpp's `llamacpp:*`, SGLang's
`sglang:*` names), and its configuration (`/v1/models`, llama.cpp's `/props`).

    values = await fetch_server_metrics(engine, client)     # {"vllm:kv_cache_usage_perc": 0.12, ...} or {}
    config = await fetch_server_config(engine, client)      # {"models": [...], "n_ctx": 4096, ...} or {}

    scrapes = SharedScrapes(engine, client)     # one engine's /metrics for all the runs on it at once
    before = await scrapes.fresh()              # read after this call began (one read for all who ask together)
    async with scrapes.watching():              # read every POLL_S while any run watches: scrapes.latest
        ...

Bounded like the stream: a short timeout and a maximum body; a server without metrics gives {}.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
from contextlib import asynccontextmanager

import httpx

from .openai_stream import ExternalEngine

PREFIXES = ("vllm:", "llamacpp:", "sglang:")
# the series the page shows; a labelled series is summed over its labels (e.g. vLLM's per-model series)
WANTED = re.compile(r"^(vllm|sglang):(kv_cache_usage_perc|num_requests_running|num_requests_waiting|"
                    r"prefix_cache_(hits|queries)(_total)?|spec_decode_num_(draft|accepted)_tokens(_total)?|"
                    r"spec_decode_num_drafts(_total)?|generation_tokens(_total)?|token_usage|cache_hit_rate)$"
                    r"|^llamacpp:(tokens_predicted_total|prompt_tokens_total|prompt_tokens_cached_total|"
                    r"requests_processing|requests_deferred|n_decode_total|kv_cache_usage_ratio|"
                    r"spec_decode_num_(draft_tokens|accepted_tokens|drafts)_total)$")
MAX_BODY_BYTES = 1 << 20
TIMEOUT_S = 2.0
POLL_S = 1.0                    # how often the /metrics of an engine that runs are read
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
# vLLM's accepted draft tokens by their position in the draft, one series per position: kept apart, as
# vllm:spec_decode_num_accepted_tokens_pos{J}_total (J from 0)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_POSITION = re.compile(r'position="(\d{1,2})"')


def per_position_key(j: int) -> str:
    return f"vllm:spec_decode_num_accepted_tokens_pos{j}_total"


def accepted_by_position(values: dict[str, float]) -> list[float]:
    """The per-position series of `values` (or of how far they moved) as a list from position 0."""
    out, j = [], 0
    while per_position_key(j) in values:
        out.append(values[per_position_key(j)])
        j += 1
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """The wanted series of a Prometheus text exposition, summed over their labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m and m.group(1) == PER_POSITION and _POSITION.search(m.group(2) or ""):
            name = per_position_key(int(_POSITION.search(m.group(2)).group(1)))
        elif not m or not WANTED.match(m.group(1)):
            continue
        else:
            name = m.group(1)
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


# The page's gauges of a server's own /metrics: (label, unit, the series that give it, in the order tried).
SERVER_GAUGES = [
    ("KV cache used", "of the server's KV cache",
     ("vllm:kv_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio")),
    ("Requests running", "on the server now", ("vllm:num_requests_running", "llamacpp:requests_processing")),
    ("Requests waiting", "queued on the server", ("vllm:num_requests_waiting", "sglang:num_requests_waiting",
                                                  "llamacpp:requests_deferred")),
    ("Prefix-cache hits", "tokens since it started", ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
                                                      "llamacpp:prompt_tokens_cached_total")),
    ("Draft tokens accepted", "accepted ÷ drafted since it started", ()),
    ("Tokens generated", "since it started", ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total")),
    ("Accepted by draft position", "1st · 2nd · … since it started (vLLM)", ()),
]
FRACTIONS = {"vllm:kv_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio"}   # 0..1
SPEC_PAIRS = (("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
              ("llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total"))


def server_gauges(values: dict[str, float]) -> list[dict]:
    """The gauges' texts from a server's series ("–" where it publishes none of a gauge's series)."""
    rows = []
    for label, unit, names in SERVER_GAUGES:
        name = next((n for n in names if n in values), None)
        if name is None:
            text = "–"
        elif name in FRACTIONS:
            text = f"{values[name]:.1%}"
        else:
            text = f"{values[name]:,.0f}"
        if label == "Draft tokens accepted":
            pair = next(((a, d) for a, d in SPEC_PAIRS if values.get(d)), None)
            text = f"{values[pair[0]]:,.0f} / {values[pair[1]]:,.0f}" if pair else "–"
        if label == "Accepted by draft position":
            text = " · ".join(f"{v:,.0f}" for v in accepted_by_position(values)) or "–"
        rows.append({"label": label, "unit": unit, "text": text})
    return rows


async def _get(client: httpx.AsyncClient, url: str, engine: ExternalEngine) -> str | None:
    """The body of a GET (at most MAX_BODY_BYTES, TIMEOUT_S a read), or None."""
    try:
        async with client.stream("GET", url, headers=engine.headers(), timeout=TIMEOUT_S) as r:
            if r.status_code != 200:
                return None
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return None
    except httpx.HTTPError:
        return None
    return body.decode("utf-8", "replace")


async def fetch_server_metrics(engine: ExternalEngine, client: httpx.AsyncClient) -> dict[str, float]:
    """The engine's wanted series now ({} if it has no metrics URL or they cannot be read)."""
    text = await _get(client, engine.metrics_url, engine) if engine.metrics_url else None
    return parse_prometheus(text) if text else {}


class SharedScrapes:
    """One engine's /metrics, read for every run on it at once instead of by each run.

    Each read costs the server's API process a rendering of all its series (vLLM's: about 50 KB of text)
    and ours a parse, so runs share them: `fresh()` gives values read by a scrape that began after the call
    (what a run's before and after need: nothing of an earlier moment), and every caller that arrives while
    one scrape is in flight shares the next one; `watching()` keeps one poller (every `poll_s`) while any run
    watches, whose values are `latest` (a new dict per scrape, never changed: events may hold it)."""

    def __init__(self, engine: ExternalEngine, client: httpx.AsyncClient, poll_s: float = POLL_S):
        self.engine, self.client, self.poll_s = engine, client, poll_s
        self.latest: dict[str, float] = {}
        self.begun = 0                          # scrapes that have begun (their task ran)
        self._task: asyncio.Task | None = None  # the last one asked for
        self._queued = False                    # it is asked for, not begun: it begins after any call now
        self._begun_at = -1e9                   # when the last one began (the event loop's clock)
        self._watchers = 0
        self._poller: asyncio.Task | None = None

    async def fresh(self) -> dict[str, float]:
        """Values of a scrape begun after this call ({} if the server gave none)."""
        need = self.begun + 1
        while True:
            task = self._task
            if task is not None and (self._queued or self.begun >= need):
                return await asyncio.shield(task)
            if task is not None and not task.done():     # begun before this call: wait, then the next one
                await asyncio.wait({task})
            else:
                self._begin()

    def _begin(self) -> None:
        self._queued = True
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> dict[str, float]:
        self._queued, self.begun, self._begun_at = False, self.begun + 1, asyncio.get_running_loop().time()
        values = await fetch_server_metrics(self.engine, self.client)
        if values:
            self.latest = values
        return values

    @asynccontextmanager
    async def watching(self):
        """While the block runs, `latest` is read every `poll_s` (one poller however many runs watch)."""
        self._watchers += 1
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            yield self
        finally:
            self._watchers -= 1
            if self._watchers == 0 and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def _poll(self) -> None:
        """A read every `poll_s`, counting those the runs asked for (a run's before or after is one)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._begun_at + self.poll_s - loop.time()))
            task = self._task
            if task is not None and not task.done():
                await asyncio.wait({task})      # the next read is due poll_s after this one began
            elif loop.time() >= self._begun_at + self.poll_s:
                self._begin()
                await asyncio.wait({self._task})

    async def aclose(self) -> None:
        """Stop reading (the app stops)."""
        for task in (self._poller, self._task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task})
        self._poller = None


async def fetch_server_config(engine: ExternalEngine, client: httpx.AsyncClient) -> dict:
    """The models the server says it serves (/v1/models; llama.cpp adds its one model's weight bytes `size`
    and `n_params`) and, from llama.cpp's /props, its context size per slot, slots and weight type ({} where
    it publishes nothing readable)."""
    out: dict = {}
    text = await _get(client, engine.base_url.rstrip("/") + "/models", engine)
    try:
        data = json.loads(text) if text else {}
        models = [m for m in data.get("data", [])[:20] if isinstance(m, dict)]
        out["models"] = [str(m.get("id"))[:200] for m in models]
        meta = models[0].get("meta") if len(models) == 1 else None      # llama.cpp: its weights' bytes
        if isinstance(meta, dict):
            out.update({key: int(meta[key]) for key in ("size", "n_params")
                        if isinstance(meta.get(key), (int, float)) and meta[key] > 0})
    except (ValueError, AttributeError, TypeError):
        pass
    if engine.kind == "llamacpp":
        text = await _get(client, engine.base_url.rstrip("/").removesuffix("/v1") + "/props", engine)
        try:
            props = json.loads(text) if text else {}
            # (its per-request "speculative.types" says "none" even where the server speculates: left out)
            out.update(n_ctx=props.get("default_generation_settings", {}).get("n_ctx"),
                       total_slots=props.get("total_slots"), model_ftype=props.get("model_ftype"))
        except (ValueError, AttributeError, TypeError):
            pass
    return out
