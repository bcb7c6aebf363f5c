"""An inference server's Prometheus `/metrics`, read for the gauges: KV usage, requests, prefix-cache hits,
speculative counts (vLLM's `vllm:*`, llama.cpp's `llamacpp:*`, SGLang's `sglang:*` names).

    values = await fetch_server_metrics(engine, client)     # {"vllm:kv_cache_usage_perc": 0.12, ...} or {}

Bounded like the stream: a short timeout and a maximum body; a server without metrics gives {}.
"""
from __future__ import annotations

import math
import re

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
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """The wanted series of a Prometheus text exposition, summed over their labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or not WANTED.match(m.group(1)):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


async def fetch_server_metrics(engine: ExternalEngine, client: httpx.AsyncClient) -> dict[str, float]:
    """The engine's wanted series now ({} if it has no metrics URL or they cannot be read)."""
    if not engine.metrics_url:
        return {}
    try:
        async with client.stream("GET", engine.metrics_url, headers=engine.headers(), timeout=TIMEOUT_S) as r:
            if r.status_code != 200:
                return {}
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return {}
    except httpx.HTTPError:
        return {}
    return parse_prometheus(body.decode("utf-8", "replace"))
