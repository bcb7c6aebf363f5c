"""engine/external/server_metrics.py's SharedScrapes against a real HTTP server on loopback (tests/hostile_engine.py's
/counting/metrics, whose counter is the number of /metrics requests it had received, each answered 50 ms later):
the runs on one engine share its /metrics reads, and a read a run waits for always began after it asked."""
import asyncio
import concurrent.futures

import httpx
import pytest
from hostile_engine import HostileEngine

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


def test_an_ask_while_a_read_is_in_flight_waits_for_the_next_one(hostile):
    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            scrapes = scrapes_of(hostile, client)
            early = asyncio.ensure_future(scrapes.fresh())
            await asyncio.sleep(0.02)                           # the first read is in flight (50 ms)
            late = await asyncio.gather(*(scrapes.fresh() for _ in range(4)))
            return await early, late
    early, late = run(go())
    assert early[KEY] == 1.0
    assert {v[KEY] for v in late} == {2.0} and hostile.scrapes == 2


def test_the_poller_counts_the_reads_runs_asked_for(hostile):
    """A run's before (or after) is a read: the poller's next one is due a poll interval after it began."""
    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            scrapes = scrapes_of(hostile, client, poll_s=0.5)
            await scrapes.fresh()                               # a run's before, at 0 s
            async with scrapes.watching():
                await asyncio.sleep(0.3)
                await scrapes.fresh()                           # another run's, at 0.3 s: the next poll is at 0.8 s
                await asyncio.sleep(0.3)
                at_06 = hostile.scrapes
                await asyncio.sleep(0.6)
            return at_06, hostile.scrapes
    at_06, at_12 = run(go())
    assert at_06 == 2 and at_12 == 3, (at_06, at_12)         # one every 0.5 s from the start would read at 0.5 s


def test_one_poller_reads_while_runs_watch_and_stops_after_the_last(hostile):
    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            scrapes = scrapes_of(hostile, client, poll_s=0.1)
            async with scrapes.watching(), scrapes.watching(), scrapes.watching():
                await asyncio.sleep(0.55)
            during = hostile.scrapes
            await asyncio.sleep(0.3)
            return scrapes.latest, during, hostile.scrapes
    latest, during, later = run(go())
    assert 2 <= during <= 6, during          # at most one read per 0.1 s (a slow machine sleeps longer): one poller
    assert later - during <= 1 and latest[KEY] >= during - 1   # at most the read in flight when the last left
