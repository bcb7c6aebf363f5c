"""Admission control: at most `limit` generations at once, the next `max_queue` starts wait in line.

    await admission.acquire(on_position)    # a slot now, or a place in line (raises Busy if that is full)
    admission.release()                     # the slot goes to the first in line, or back to the pool

NOTE (invariants): event loop only (no locks). `running` counts slots held (<= limit); a released slot is
handed straight to the first waiter, so a newcomer never overtakes the line. A waiter that is cancelled
leaves the line, or, if it had just been given the slot, passes it on.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

import anyio


class Busy(Exception):
    """No slot and no room in line: the client is told to retry (close code 1013)."""


class _Waiter:
    __slots__ = ("event", "on_position", "position", "granted")

    def __init__(self, on_position: Callable[[int], None] | None):
        self.event = anyio.Event()
        self.on_position = on_position
        self.position = 0
        self.granted = False


class Admission:
    def __init__(self, limit: int, max_queue: int):
        self.limit, self.max_queue = limit, max_queue
        self.running = 0
        self.refused = 0
        self._line: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def acquire(self, on_position: Callable[[int], None] | None = None) -> None:
        if self.running < self.limit and not self._line:
            self.running += 1
            return
        if len(self._line) >= self.max_queue:
            self.refused += 1
            raise Busy(f"busy: {self.running} generations are running and {len(self._line)} waiting "
                       f"(limits {self.limit} and {self.max_queue}); retry in a moment")
        waiter = _Waiter(on_position)
        self._line.append(waiter)
        self._positions()
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self.release()
            else:
                self._line.remove(waiter)
                self._positions()
            raise

    def release(self) -> None:
        if self._line:
            waiter = self._line.popleft()
            waiter.granted = True          # the slot passes on: `running` stays
            waiter.event.set()
            self._positions()
        else:
            self.running -= 1

    def _positions(self) -> None:
        for i, waiter in enumerate(self._line, 1):
            if waiter.position != i:
                waiter.position = i
                if waiter.on_position is not None:
                    waiter.on_position(i)
