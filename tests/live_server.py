"""A real uvicorn server in a thread, for tests that need real sockets (websockets, browsers).

NOTE: `TestClient.websocket_connect` is in-memory (no ping, size limit, backpressure or close handshake),
so websocket behaviour is tested against this. The server is configured as `decoding-playground serve`
configures it: uvicorn's message limit above the app's 64 KiB (app/config.py), no per-message deflate.
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Iterator

import uvicorn

from app.config import TRANSPORT_MAX_MESSAGE_BYTES as WS_MAX_SIZE
from app.ws.transport import WS_PROTOCOL

SERVER_START_TIMEOUT_S = 30.0


def _wait_for_healthz(base_url: str, thread: threading.Thread, timeout_s: float) -> None:
    """Polls /healthz until it answers 200; fails early if the server thread died."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("uvicorn server thread exited during startup (see the log above)")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last_error = error
        time.sleep(0.05)
    raise RuntimeError(f"server at {base_url} not healthy after {timeout_s} s: {last_error!r}")


@contextmanager
def serve(app, host: str = "127.0.0.1") -> Iterator[str]:
    """Run `app` on a free port; yields its base URL (http://127.0.0.1:PORT)."""
    # Bind the socket ourselves and hand it to uvicorn: no race between picking a port and using it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    base_url = f"http://{host}:{port}"
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", ws=WS_PROTOCOL,
                            ws_max_size=WS_MAX_SIZE, ws_per_message_deflate=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        _wait_for_healthz(base_url, thread, SERVER_START_TIMEOUT_S)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("uvicorn server thread did not stop within 15 s")
