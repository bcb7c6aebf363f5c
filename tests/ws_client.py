"""A websocket client for the tests of `/api/ws` and `/ws` against a real uvicorn server (tests/live_server.py):
bounded waits (`asyncio.wait_for`), "nothing arrives" checked over a short, stated window, and scenarios run on a
loop of their own."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import urllib.request
from contextlib import asynccontextmanager

import websockets

RECV_TIMEOUT_S = 20.0
QUIET_S = 0.4            # window in which a paused generation must send nothing


def ws_url(base_url: str, path: str = "/api/ws") -> str:
    return base_url.replace("http://", "ws://") + path


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Client:
    def __init__(self, ws):
        self.ws = ws
        self.seen: list[dict] = []

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def recv(self, timeout: float = RECV_TIMEOUT_S) -> dict:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.seen.append(message)
        return message

    async def until(self, *types: str, timeout: float = 60.0) -> dict:
        """Receive until a message of one of `types` arrives (each receive bounded, the total too)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {types} within {timeout} s; last: {[m['type'] for m in self.seen[-10:]]}")
            message = await self.recv(min(left, RECV_TIMEOUT_S))
            if message["type"] in types:
                return message

    async def quiet(self, seconds: float = QUIET_S) -> list[dict]:
        """Everything that arrives within `seconds` (expected: nothing)."""
        got = []
        try:
            while True:
                got.append(await self.recv(seconds))
        except asyncio.TimeoutError:
            return got


@asynccontextmanager
async def connect(base_url: str, path: str = "/api/ws", **kwargs):
    async with websockets.connect(ws_url(base_url, path), max_size=2 ** 22, open_timeout=10, **kwargs) as ws:
        yield Client(ws)


def run(coro, timeout: float = 120):
    """Run a scenario to its end (at most `timeout` s) on a fresh event loop in its own thread: Playwright's
    sync API (the browser tests, same session) keeps a loop running in the main thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(coro, timeout)).result()


def wait_for_stats(base_url: str, predicate, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = get_json(base_url + "/api/stats")
        if predicate(stats):
            return stats
        if time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


PROMPT = "def main(argv):\n    "
