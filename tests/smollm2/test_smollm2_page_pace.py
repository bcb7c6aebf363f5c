"""The page at full speed: a slow model's rounds go out one a message, a fast model's are coalesced
(app/ws/sender.py). Real uvicorn, the page's /ws read by a client that acknowledges every message as the page does."""
import asyncio
import time

import websockets

from test_ws_api import get_json, run, ws_url
from test_ws_html import HtmlClient, status_is


def tokens_per_message(c: HtmlClient) -> list[int]:
    return [n for f in c.messages if (n := sum("tok" in a.get("class", "").split() for _, a in f.all))]


async def full_speed_run(base: str, **fields) -> tuple[list[int], float]:
    async with websockets.connect(ws_url(base, "/ws"), open_timeout=10) as ws:
        c = HtmlClient(ws)
        await c.until(lambda f: True)
        await c.send(action="toggle", speed="max", temperature="0", **fields)
        t0 = time.monotonic()
        await c.until(status_is("done"), timeout=120)
        return tokens_per_message(c), time.monotonic() - t0


def test_smollm2s_tokens_appear_as_they_are_made_and_a_fast_models_ten_times_a_second(smollm2_dir, live_server):
    """SmolLM2's rounds take 30-45 ms: each goes out alone (before, they went in twos and threes ten times a
    second). Tolerance: 80% of its token messages hold one token (a stalled event loop may join two rounds).
    The character target's rounds take about a millisecond: at most 10 messages a second, plus the first."""
    async def scenario():
        deadline = time.monotonic() + 600                       # SmolLM2's weights load in the background
        while True:
            models = {m["name"]: m for m in (await asyncio.to_thread(get_json, live_server + "/api/models"))["models"]}
            if "smollm2-135m" in models and not models["smollm2-135m"].get("loading"):
                break
            assert time.monotonic() < deadline, "SmolLM2 did not load within 600 s"
            await asyncio.sleep(0.2)
        slow, _ = await full_speed_run(live_server, model="smollm2-135m", method="none", chat="true",
                                       max_tokens="24")
        fast, seconds = await full_speed_run(live_server, model="target-mha", method="none", max_tokens="300")
        return slow, fast, seconds

    slow, fast, seconds = run(scenario(), timeout=900)
    assert sum(slow) >= 12 and sum(n == 1 for n in slow) >= 0.8 * len(slow), slow
    assert sum(fast) >= 100 and len(fast) <= 10 * seconds + 2, (fast, seconds)
