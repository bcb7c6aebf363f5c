"""How messages reach the socket: `CoalescingTransport` (app/ws/transport.py) and the JSON encoder of `/api/ws`
(app/views/json.py). The end-to-end tests (tests/test_ws_api.py, tests/test_serving.py) run the real server
with this transport; these check its rules one by one with a recording transport."""
from __future__ import annotations

import asyncio
import json

import numpy as np

from app.views.json import dumps
from app.ws.transport import CoalescingTransport, CoalescingWebSocketProtocol
from ws_client import run      # a fresh loop in its own thread: the browser tests keep one running here


class Recorder(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self.calls.append("write")

    def close(self) -> None:
        self.closing = True
        self.calls.append("close")

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def test_writes_of_one_turn_go_out_as_one_write_in_order():
    async def main():
        real = Recorder()
        t = CoalescingTransport(real, asyncio.get_running_loop())
        for i in range(5):
            t.write(b"frame%d;" % i)
        assert real.writes == []                 # nothing yet: the flush runs when the loop next turns
        await asyncio.sleep(0)
        assert real.writes == [b"frame0;frame1;frame2;frame3;frame4;"]
        t.write(b"next")
        await asyncio.sleep(0)
        assert real.writes[1:] == [b"next"]
        assert (t.chunks, t.writes) == (6, 2)
    run(main())


def test_close_sends_what_is_pending_first_and_a_closing_transport_drops_it():
    async def main():
        real = Recorder()
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"close frame")
        t.close()
        assert real.calls == ["write", "close"] and real.writes == [b"close frame"]
        t.write(b"late")                        # the peer is gone: dropped, as the real transport would
        await asyncio.sleep(0)
        assert real.writes == [b"close frame"]
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)
    run(main())


def test_the_protocol_is_uvicorns_default_one():
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    assert issubclass(CoalescingWebSocketProtocol, AutoWebSocketsProtocol)


def test_dumps_is_compact_json_that_reads_back_as_json_dumps_would():
    event = {"type": "token", "round": 3, "p": 0.25, "q": None, "top_p": [[17, "é\n\"<", 0.5]],
             "values": {"verify_ms_by_tokens": {1: 0.5, 5: 1.25}}, "n": np.int64(7), "x": np.float64(0.1)}
    text = dumps(event)
    assert text.startswith('{"type":"token",') and ", " not in text and ": " not in text
    assert json.loads(text) == json.loads(json.dumps(event, default=lambda v: v.item()))
    assert json.loads(dumps({"big": 2 ** 70})) == {"big": 2 ** 70}      # beyond orjson: json.dumps
