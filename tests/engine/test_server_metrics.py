"""engine/external/server_metrics.py's SharedScrapes against a /metrics whose counter is the number of requests it
had received, each answered 50 ms later: the runs on one engine share its /metrics reads, and a read a run waits
for always began after it asked. Once against a real HTTP server on loopback (tests/hostile_engine.py's
/counting/metrics); the poller's timing on virtual time (tests/virtual_time.py) with the same server in the loop,
so that every read happens when the code asks for it, however busy the machine."""
import asyncio
import concurrent.futures

import httpx
import pytest
from hostile_engine import HostileEngine
from virtual_time import run_on_virtual_time

from engine.external.openai_stream import ExternalEngine
from engine.external.server_metrics import SharedScrapes

KEY = "vllm:generation_tokens_total"


@pytest.fixture
def hostile():
    with HostileEngine() as server:
        yield server


def run(coro):
    """On a fresh event loop in its own thread (the browser tests of the same session keep one in the main thread)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def scrapes_of(hostile, client, poll_s=1.0) -> SharedScrapes:
    engine = ExternalEngine("counting", hostile.url("counting"), metrics_url=hostile.url("counting")[:-3] + "/metrics")
    return SharedScrapes(engine, client, poll_s)


def test_runs_that_ask_together_share_one_read_begun_after_they_asked(hostile):
    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            scrapes = scrapes_of(hostile, client)
            first = await scrapes.fresh()
            together = await asyncio.gather(*(scrapes.fresh() for _ in range(16)))
            after = await scrapes.fresh()
            return first, together, after
    first, together, after = run(go())
    assert first[KEY] == 1.0
    assert {v[KEY] for v in together} == {2.0}                 # sixteen runs, one read
    assert after[KEY] == 3.0 and hostile.scrapes == 3          # a later ask never takes an earlier read


class CountingMetrics:
    """tests/hostile_engine.py's /counting/metrics inside the event loop (an httpx transport): its counter is the
    number of requests it had received, each answered 50 ms later on the loop's clock."""

    def __init__(self):
        self.scrapes = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.scrapes += 1
        n = self.scrapes
        await asyncio.sleep(0.05)
        return httpx.Response(200, text=f"# TYPE vllm:generation_tokens counter\n{KEY} {n}.0\n")


def on_virtual_time(scenario):
    """`scenario(scrapes, server)` on virtual time, with SharedScrapes reading a CountingMetrics every `poll_s`."""
    def with_scrapes(poll_s: float):
        async def go():
            server = CountingMetrics()
            async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
                engine = ExternalEngine("counting", "http://engine.test/v1", metrics_url="http://engine.test/metrics")
                return await scenario(SharedScrapes(engine, client, poll_s), server)
        return run_on_virtual_time(go())
    return with_scrapes


def test_an_ask_while_a_read_is_in_flight_waits_for_the_next_one():
    @on_virtual_time
    async def scenario(scrapes, server):
        early = asyncio.ensure_future(scrapes.fresh())
        await asyncio.sleep(0.02)                           # the first read is in flight (0 - 50 ms)
        assert server.scrapes == 1
        late = await asyncio.gather(*(scrapes.fresh() for _ in range(4)))
        return await early, late, server.scrapes

    early, late, scrapes = scenario(1.0)
    assert early[KEY] == 1.0
    assert {v[KEY] for v in late} == {2.0} and scrapes == 2


def test_the_poller_counts_the_reads_runs_asked_for():
    """A run's before (or after) is a read: the poller's next one is due a poll interval after it began."""
    @on_virtual_time
    async def scenario(scrapes, server):
        await scrapes.fresh()                               # a run's before, at 0 s (answered at 0.05 s)
        async with scrapes.watching():
            await asyncio.sleep(0.3)
            await scrapes.fresh()                           # another run's, at 0.35 s: the next poll is at 0.85 s
            await asyncio.sleep(0.3)
            at_07 = server.scrapes
            await asyncio.sleep(0.6)
            return at_07, server.scrapes

    at_07, at_13 = scenario(0.5)
    assert at_07 == 2 and at_13 == 3, (at_07, at_13)         # one every 0.5 s from the start would read at 0.5 s


def test_one_poller_reads_while_runs_watch_and_stops_after_the_last():
    @on_virtual_time
    async def scenario(scrapes, server):
        async with scrapes.watching(), scrapes.watching(), scrapes.watching():
            await asyncio.sleep(0.55)
        during = server.scrapes
        await asyncio.sleep(0.3)
        return scrapes.latest, during, server.scrapes

    latest, during, later = scenario(0.1)
    assert during == 6, during              # at 0, 0.1, ... 0.5 s: one poller (three would read three times as often)
    assert later == during and latest[KEY] >= during - 1       # at most the read in flight when the last left
