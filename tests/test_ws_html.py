"""`/ws`: the page's form messages in, HTML fragments for htmx-ext-ws out (real uvicorn, `websockets` client)."""
from __future__ import annotations

import asyncio
import json
import re
import time
from html.parser import HTMLParser

import websockets

from ws_client import PROMPT, get_json, run, wait_for_stats, ws_url

VOID = {"input", "br", "img", "meta", "link", "hr", "wbr", "source"}


class Fragments(HTMLParser):
    """Top-level elements of a server message, and every element's attributes."""

    def __init__(self, text: str):
        super().__init__()
        self.depth = 0
        self.top: list[tuple[str, dict]] = []
        self.all: list[tuple[str, dict]] = []
        self.blocks: list[list[int]] = []          # per top-level element: the KV blocks in it, in order
        self.raw = text
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.depth == 0:
            self.top.append((tag, attrs))
            self.blocks.append([])
        if "data-kv-block" in attrs:
            self.blocks[-1].append(int(attrs["data-kv-block"]))
        self.all.append((tag, attrs))
        if tag not in VOID:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag not in VOID:
            self.depth -= 1


def form(**changes) -> dict:
    """The playground form as htmx-ext-ws sends it: strings, a checkbox with its hidden twin as a list."""
    values = {"prompt": PROMPT, "speed": "max", "model": "", "num_kv_heads": "", "max_tokens": "16",
              "temperature": "0", "top_p": "1", "seed": "0", "method": "draft_model", "num_speculative_tokens": "3",
              "num_speculative_tokens_schedule": "constant", "prompt_lookup_min": "1", "prompt_lookup_max": "4",
              "kv_cache": ["false", "true"], "kv_cache_dtype": "auto", "block_size": "16",
              "enable_prefix_caching": ["false", "true"], "HEADERS": {"HX-Request": "true", "HX-Trigger": "controls"}}
    values.update(changes)
    return values


class HtmlClient:
    def __init__(self, ws):
        self.ws = ws
        self.messages: list[Fragments] = []

    async def send(self, **fields) -> None:
        await self.ws.send(json.dumps(form(**fields)))

    async def until(self, predicate, timeout: float = 60.0) -> Fragments:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("condition not met in time")
            fragments = Fragments(await asyncio.wait_for(self.ws.recv(), min(left, 20)))
            self.messages.append(fragments)
            await self.ws.send(json.dumps({"ack": len(self.messages)}))       # as the page does
            if predicate(fragments):
                return fragments

    def elements(self, predicate=lambda tag, attrs: True):
        return [(t, a) for f in self.messages for t, a in f.all if predicate(t, a)]


def status_is(state):
    return lambda f: any(a.get("id") == "run-status" and a.get("data-state") == state for _, a in f.top)


def test_a_run_streams_fragments_that_htmx_can_swap_by_id(live_server):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            hello = await c.until(lambda f: True)
            assert any(a.get("id") == "conn" for _, a in hello.top)
            await c.send(action="toggle")
            await c.until(status_is("done"))
            for f in c.messages:
                for tag, attrs in f.top:             # every top-level element: an id and hx-swap-oob
                    assert attrs.get("id") and attrs.get("hx-swap-oob"), (tag, attrs)
            statuses = {a["data-token-status"] for _, a in c.elements(lambda t, a: "tok" in a.get("class", ""))}
            assert statuses and statuses <= {"accepted", "rejected", "resampled", "bonus", "target"}
            metrics = {a["data-metric"] for _, a in c.elements(lambda t, a: "data-metric" in a)}
            assert metrics == {"acceptance_rate", "mean_acceptance_length", "ttft_ms", "itl_ms", "tokens_per_s",
                               "kv_cache_bytes", "kv_bytes_per_token", "kv_blocks_used"}
            # KV bytes in use are the target's, and say so; the draft model's cache shows beside them
            gauges = [f.raw for f in c.messages if 'id="gauge-grid"' in f.raw]
            assert gauges and all("KV bytes in use (target)" in g for g in gauges)
            drafts = [d for g in gauges for d in re.findall(r'data-figure="draft_kv_cache_bytes">([^<]*)<', g)]
            assert any(re.fullmatch(r"\+ [\d.]+ (B|KiB|MiB) in the draft pool", d) for d in drafts), drafts
            cells = c.elements(lambda t, a: "data-kv-block" in a)
            assert cells and {a["data-state"] for _, a in cells} <= {"free", "used", "shared", "cached"}
            appends = [a["hx-swap-oob"] for f in c.messages for _, a in f.top if a.get("id") == "stream-append"]
            assert appends and set(appends) == {"beforeend:#stream"}

    run(scenario())


def test_kv_changes_are_swapped_as_whole_segments_of_the_grid(live_server):
    """The first message draws the pool whole; later changes send each changed segment of KV_SEGMENT blocks
    as one element (never an element per block), with every block of the segment in it."""
    from app.views.kv_map import KV_SEGMENT

    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", method="none", max_tokens="96")
            await c.until(status_is("done"))
            grids = [(f, i) for f in c.messages for i, (_, a) in enumerate(f.top) if a.get("id") == "kv-target-grid"]
            assert grids, "the pool is drawn whole first"
            num_blocks = len(grids[0][0].blocks[grids[0][1]])
            assert grids[0][0].blocks[grids[0][1]] == list(range(num_blocks)) and num_blocks > KV_SEGMENT
            later = c.messages[c.messages.index(grids[0][0]) + 1:]
            segments = [(int(a["id"].rsplit("-s", 1)[1]), f.blocks[i], a) for f in later
                        for i, (_, a) in enumerate(f.top) if a.get("id", "").startswith("kv-target-s")]
            assert segments, "96 tokens fill new blocks after the first message"
            for k, blocks, attrs in segments:
                assert attrs.get("hx-swap-oob") == "true" and attrs.get("class") == "kv-seg"
                assert blocks == list(range(k * KV_SEGMENT, min((k + 1) * KV_SEGMENT, num_blocks)))
            events = {a.get("data-event") for _, a in c.elements(lambda t, a: "data-kv-block" in a)}
            assert "allocate" in events
            assert not [a["id"] for f in c.messages for _, a in f.top if a.get("id", "").split("-")[-1].isdigit()]

    run(scenario())


def test_bad_form_value_gets_an_error_fragment_and_the_connection_stays_usable(live_server):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", temperature="5")
            error = await c.until(lambda f: any(a.get("id") == "error" and a.get("role") == "alert" for _, a in f.top))
            assert error
            await ws.send("{not json")
            await c.until(lambda f: any(a.get("id") == "error" for _, a in f.top))
            await c.send(action="dance")
            await c.until(lambda f: any(a.get("id") == "error" for _, a in f.top))
            await c.send(action="toggle")
            await c.until(status_is("done"))

    run(scenario())


def test_a_form_change_mid_run_is_a_live_setting_and_a_seed_change_waits_for_the_next_run(live_server):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", speed="10", max_tokens="300", num_speculative_tokens="2")
            await c.until(lambda f: any(a.get("id") == "draft-lane" and a.get("data-num-draft-tokens") == "2"
                                        for _, a in f.top))
            await c.send(speed="10", max_tokens="300", num_speculative_tokens="6", seed="9")
            await c.until(lambda f: any(a.get("data-note") == "settings_applied" for _, a in f.all))
            lane = await c.until(lambda f: any(a.get("id") == "draft-lane" and a.get("data-num-draft-tokens") == "6"
                                               for _, a in f.top))
            assert lane
            notes = [a.get("data-note") for _, a in c.elements(lambda t, a: "data-note" in a)]
            assert "next_run" in notes                     # the seed is not a live setting
            await c.send(action="stop", speed="10")
            await c.until(status_is("done"))

    run(scenario())


def test_reset_clears_the_view_and_a_closed_page_frees_its_blocks(live_server):
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", speed="20", max_tokens="300")
            await c.until(lambda f: any("data-kv-block" in a for _, a in f.all))
            await c.send(action="reset", speed="20")
            await c.until(status_is("idle"))
            await c.send(action="toggle", speed="20", max_tokens="300")
            await c.until(status_is("running"))
            assert get_json(live_server + "/api/stats")["sessions"] >= 1

    run(scenario())
    stats = wait_for_stats(live_server, lambda s: s["sessions"] == 0 and s["kv_blocks_used"] == 0)
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0, stats


def test_choosing_another_target_updates_its_kv_head_method_and_race_options(live_server):
    models = get_json(live_server + "/api/models")["models"]
    other = next(m for m in models if m["role"] == "target" and m["attention"] != "MHA")

    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(speed="5", model=other["name"], num_kv_heads="")      # the first change after loading
            select = await c.until(lambda f: any(a.get("id") == "f-num_kv_heads" for _, a in f.top))
            start = next(i for i, (t, a) in enumerate(select.all) if a.get("id") == "f-num_kv_heads")
            end = next((i for i, (t, _) in enumerate(select.all) if t == "select" and i > start), len(select.all))
            options = [a.get("value") for t, a in select.all[start:end] if t == "option"]
            assert options[0] == "" and set(options[1:]) == {str(n) for n in other["kv_head_variants"]}
            assert any(a.get("data-note") == "model" for _, a in c.elements())
            methods = {a.get("value"): "disabled" in a for t, a in select.all[end:]
                       if t == "option" and "data-setting" not in a}             # the form's, not the race's
            assert methods["eagle"] and methods["medusa"]           # heads are trained for target-mha only
            race = {a.get("value") for t, a in select.all if t == "option" and a.get("data-setting") == "method"}
            assert race == {"none", "draft_model", "ngram"}         # and the race offers what this model can run

    run(scenario())
