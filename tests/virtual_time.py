"""An asyncio event loop on virtual time, for tests of code that waits on the loop's clock (`asyncio.sleep`,
`loop.time()`, timeouts): whenever nothing is ready to run, its clock jumps to the next timer instead of waiting
for it. A test of "a read every 0.5 s" then takes no real time, and no machine is too slow for it: what it checks
happens at the times the code asked for, exactly.

    result = run_on_virtual_time(scenario())       # the loop's clock starts at 0

NOTE: time spent waiting for I/O or for another thread does not count, and a timer due meanwhile fires first:
give such code its answers in the loop itself (an `httpx.MockTransport` handler, say), not from a real server.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import selectors


class JumpingSelector(selectors.DefaultSelector):
    """A selector that, with nothing ready, moves its clock by the timeout it was given instead of sleeping."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def select(self, timeout=None):
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:            # no timer at all: only I/O (or another thread) can wake the loop
            return super().select(None)
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        self._jumping = JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


def run_on_virtual_time(coro):
    """Run `coro` to its end on a VirtualTimeLoop, in a thread of its own (the browser tests of the same session
    keep a loop running in the main thread)."""
    def main():
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            return runner.run(coro)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(main).result()
