"""`/metrics`: the server's figures in the Prometheus text format (0.0.4), with vLLM's names where one exists.

Written by hand (a few counters, gauges and histograms) rather than with prometheus_client, whose output
format it follows: a counter family `vllm:prefix_cache_queries` is exposed as the sample
`vllm:prefix_cache_queries_total`, a histogram as `_bucket{le=...}`, `_sum` and `_count`.

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
| playground_* | | websocket connections, watchers, rooms, KV blocks per pool, scheduler steps and batches |

NOTE (threads): counters and histograms are updated in the engine thread (`observe`) and read on the
event loop (`render`); one lock makes each update and each read whole.
"""
from __future__ import annotations

import math
import threading
from collections import defaultdict

# vLLM's buckets, with the small ones a CPU engine needs in front
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0)


def _escape(value) -> str:
    return str(value).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(x) -> str:
    if isinstance(x, float):
        if math.isinf(x):
            return "+Inf" if x > 0 else "-Inf"
        return repr(x)
    return str(x)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, x: float) -> None:
        for i, le in enumerate(self.buckets):
            if x <= le:
                self.counts[i] += 1
                break
        self.sum += x
        self.count += 1

    def lines(self, name: str, labels: dict) -> list[str]:
        out, cumulative = [], 0
        for le, n in zip(self.buckets, self.counts):
            cumulative += n
            out.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(le))})} {cumulative}")
        out.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.count}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class ServerMetrics:
    """Request and speculative-decoding figures, keyed by the target model's name."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self.histograms: dict[str, dict[tuple, Histogram]] = defaultdict(dict)

    def inc(self, name: str, labels: tuple, value: float = 1) -> None:
        self.counters[name][labels] += value

    def hist(self, name: str, labels: tuple, buckets, x: float) -> None:
        h = self.histograms[name].get(labels)
        if h is None:
            h = self.histograms[name][labels] = Histogram(buckets)
        h.observe(x)

    def observe(self, link, event, now: float) -> None:
        """One engine event of a served generation (engine thread)."""
        model = (("model_name", link.model_name),)
        t = event.type
        with self.lock:
            if t == "prefill":
                self.inc("vllm:prefix_cache_queries", model, event.num_tokens)
                self.inc("vllm:prefix_cache_hits", model, event.num_cached_tokens)
                self.inc("vllm:prompt_tokens", model, event.num_tokens)
            elif t == "token":
                if event.status != "rejected":
                    self.inc("vllm:generation_tokens", model)
                if event.status == "accepted":
                    self.inc("vllm:spec_decode_num_accepted_tokens_per_pos",
                             model + (("position", str(event.position - 1)),))
            elif t == "round":
                if event.num_draft_tokens:
                    self.inc("vllm:spec_decode_num_drafts", model)
                    self.inc("vllm:spec_decode_num_draft_tokens", model, event.num_draft_tokens)
                    self.inc("vllm:spec_decode_num_accepted_tokens", model, event.num_accepted)
            elif t == "metrics":
                if link.first_token_at is None:
                    link.first_token_at = now
                    if link.requested_at is not None:
                        self.hist("vllm:time_to_first_token_seconds", model, TTFT_BUCKETS, now - link.requested_at)
                else:
                    self.hist("vllm:inter_token_latency_seconds", model, ITL_BUCKETS, now - link.round_started_at)
            elif t in ("done", "error"):
                reason = event.summary.get("finish_reason") if t == "done" else "error"
                self.inc("vllm:request_success", model + (("finished_reason", reason or "unknown"),))
                if link.requested_at is not None:
                    self.hist("vllm:e2e_request_latency_seconds", model, E2E_BUCKETS, now - link.requested_at)

    # --- the text format ---------------------------------------------------------------------------
    HELP = {
        "vllm:prefix_cache_queries": ("counter", "Prefix cache queries, in prompt tokens looked up."),
        "vllm:prefix_cache_hits": ("counter", "Prefix cache hits, in prompt tokens found cached."),
        "vllm:prompt_tokens": ("counter", "Prompt tokens prefilled."),
        "vllm:generation_tokens": ("counter", "Output tokens generated."),
        "vllm:request_success": ("counter", "Finished generations, by finish reason."),
        "vllm:spec_decode_num_drafts": ("counter", "Speculative rounds that proposed draft tokens."),
        "vllm:spec_decode_num_draft_tokens": ("counter", "Draft tokens proposed."),
        "vllm:spec_decode_num_accepted_tokens": ("counter", "Draft tokens accepted."),
        "vllm:spec_decode_num_accepted_tokens_per_pos": ("counter", "Accepted draft tokens per position."),
        "vllm:time_to_first_token_seconds": ("histogram", "Start message to first token (queue included)."),
        "vllm:inter_token_latency_seconds": ("histogram", "One round's latency under load (pacing excluded)."),
        "vllm:e2e_request_latency_seconds": ("histogram", "Start message to the end of the generation."),
    }

    def render(self, gauges: list[tuple[str, str, str, dict, float]]) -> str:
        """The exposition text: `gauges` are (name, type, help, labels, value) rows read at scrape time."""
        lines: list[str] = []
        seen: set[str] = set()
        for name, kind, help_, labels, value in gauges:
            if name not in seen:
                seen.add(name)
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            sample = f"{name}_total" if kind == "counter" else name
            lines.append(f"{sample}{_labels(labels)} {_num(value)}")
        with self.lock:
            for name, (kind, help_) in self.HELP.items():
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
                if kind == "counter":
                    for labels, value in sorted(self.counters.get(name, {}).items()):
                        lines.append(f"{name}_total{_labels(dict(labels))} {_num(value)}")
                else:
                    for labels, h in sorted(self.histograms.get(name, {}).items()):
                        lines += h.lines(name, dict(labels))
        return "\n".join(lines) + "\n"
