"""`/metrics`: the server's figures in the Prometheus text format (0.0.4), with vLLM's names where one exists.

Through prometheus_client, as vLLM does: a counter family `vllm:prefix_cache_queries` is exposed as the
sample `vllm:prefix_cache_queries_total`, a histogram as `_bucket{le=...}`, `_sum` and `_count`; the
gauges read at scrape time (sessions, pools, the engine thread) come from the router's rows.

| name | type | what |
|---|---|---|
| vllm:num_requests_running / _waiting | gauge | generations holding a slot / waiting for one |
| vllm:kv_cache_usage_perc | gauge | used blocks / blocks, per KV pool (0..1) |
| vllm:prefix_cache_queries / _hits | counter | prompt tokens looked up in the prefix cache / found there |
| vllm:prompt_tokens / vllm:generation_tokens | counter | prompt tokens prefilled / output tokens |
| vllm:request_success | counter | finished generations, by `finished_reason` |
| vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens | counter | rounds that drafted; tokens |
| vllm:spec_decode_num_accepted_tokens_per_pos | counter | accepted tokens per draft position (0-based `position`) |
| vllm:time_to_first_token_seconds | histogram | start message -> first token (queue included; not for paused starts) |
| vllm:inter_token_latency_seconds | histogram | one round, boundary to its last event (pacing left out) |
| vllm:e2e_request_latency_seconds | histogram | start message -> done (runs started paused are left out) |
| playground_kv_pool_bytes | gauge | K/V memory per pool (pools come and go: an idle one may be freed) |
| playground_kv_cache_memory_bytes | gauge | what all pools may hold together (--kv-cache-memory) |
| playground_kv_pools_freed / _refused | counter | idle pools freed to make room / requests whose pool did not fit |
| playground_suffix_decoding_tree_nodes / _cached_requests | gauge | suffix decoding's global trees per model: nodes, responses held |
| playground_suffix_decoding_max_tree_nodes | gauge | their bound: nodes + cached responses of all of them (--suffix-decoding-max-tree-nodes) |
| playground_* | | websocket connections, watchers, rooms, KV blocks per pool, scheduler steps and batches |

NOTE (threads): counters and histograms are updated in the engine thread (`observe`) and read by a scrape
(`render`); prometheus_client's own locks make each update and read whole. Each ServerMetrics has its own
registry (a test process builds many servers).
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()       # no `_created` samples: vLLM's dashboards do not read them
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# vLLM's buckets, with the small ones a CPU engine needs in front
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
# vLLM's inter-token buckets, with finer ones from 15 to 40 ms, where SmolLM2's decode step falls (`bench page`)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0)
MODEL = ("model_name",)


class _ScrapeRows:
    """A collector of the (name, type, help, labels, value) rows handed to `render`."""

    def __init__(self):
        self.rows: list[tuple] = []

    def collect(self):
        families: dict[str, object] = {}
        for name, kind, help_, labels, value in self.rows:
            family = families.get(name)
            if family is None:
                make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[name] = make(name, help_, labels=list(labels))
            family.add_metric([str(v) for v in labels.values()], value)
        return list(families.values())


class ServerMetrics:
    """Request and speculative-decoding figures, by the target model's name."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up.",
                                      MODEL, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens found cached.",
                                   MODEL, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled.", MODEL, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Output tokens generated.", MODEL, registry=r)
        self.request_success = Counter("vllm:request_success", "Finished generations, by finish reason.",
                                       MODEL + ("finished_reason",), registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative rounds that proposed draft tokens.",
                              MODEL, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", MODEL, registry=r)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", MODEL,
                                       registry=r)
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens per position.", MODEL + ("position",), registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Start message to first token (queue included).",
                              MODEL, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "One round's latency under load (pacing excluded).",
                             MODEL, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Start message to the end of the generation.",
                             MODEL, buckets=E2E_BUCKETS, registry=r)
        self._models: dict[str, _ModelMetrics] = {}
        self._scrape = _ScrapeRows()
        self._scrape_lock = threading.Lock()
        r.register(self._scrape)

    def _of(self, model: str) -> "_ModelMetrics":
        """The model's labelled children, made once: `labels()` costs more than the update it selects."""
        children = self._models.get(model)
        if children is None:
            children = self._models[model] = _ModelMetrics(self, model)
        return children

    def observe(self, link, event, now: float) -> None:
        """One engine event of a served generation (engine thread)."""
        t = event.type
        if t in ("draft", "kv"):
            return
        m = self._of(link.model_name)
        if t == "token":
            if event.status != "rejected":
                m.generation_tokens.inc()
            if event.status == "accepted":
                m.accepted_at(event.position - 1).inc()
        elif t == "round":
            if event.num_draft_tokens:
                m.drafts.inc()
                m.draft_tokens.inc(event.num_draft_tokens)
                m.accepted_tokens.inc(event.num_accepted)
        elif t == "metrics":
            if link.first_token_at is None:
                link.first_token_at = now
                if link.requested_at is not None:
                    m.ttft.observe(now - link.requested_at)
            else:
                m.itl.observe(now - link.round_started_at)
        elif t == "prefill":
            m.prefix_queries.inc(event.num_tokens)
            m.prefix_hits.inc(event.num_cached_tokens)
            m.prompt_tokens.inc(event.num_tokens)
        elif t in ("done", "error"):
            reason = event.summary.get("finish_reason") if t == "done" else "error"
            self.request_success.labels(link.model_name, reason or "unknown").inc()
            if link.requested_at is not None:
                m.e2e.observe(now - link.requested_at)

    def value(self, sample: str, **labels) -> float | None:
        """One sample's value now (e.g. `vllm:generation_tokens_total`, model_name=...), None if it has none."""
        return self.registry.get_sample_value(sample, labels)

    def render(self, gauges: list[tuple[str, str, str, dict, float]]) -> str:
        """The exposition text (format 0.0.4): `gauges` are (name, type, help, labels, value) rows read at
        scrape time."""
        with self._scrape_lock:
            self._scrape.rows = gauges
            try:
                return generate_latest(self.registry).decode()
            finally:
                self._scrape.rows = []


class _ModelMetrics:
    """One model's children of the labelled families (engine thread only)."""

    def __init__(self, m: ServerMetrics, model: str):
        self.model, self._per_pos, self._family = model, {}, m.accepted_per_pos
        for name in ("prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens", "drafts", "draft_tokens",
                     "accepted_tokens", "ttft", "itl", "e2e"):
            setattr(self, name, getattr(m, name).labels(model))

    def accepted_at(self, position: int):
        child = self._per_pos.get(position)
        if child is None:
            child = self._per_pos[position] = self._family.labels(self.model, str(position))
        return child
