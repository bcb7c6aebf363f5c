"""A small OpenAI-compatible HTTP server on loopback that answers badly on purpose (a real socket).

Each scenario is a path prefix: http://127.0.0.1:PORT/<scenario>/v1/chat/completions; /counting/metrics
counts its readers.
Every request it receives is recorded in `requests` (method, path), so that a test can also prove what was
*not* asked for.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):          # quiet
        pass

    def do_GET(self):
        self.server.requests.append(("GET", self.path))
        if self.path == "/counting/metrics":
            self._counting_metrics()
        else:
            self._plain(404, b"not found")

    def _counting_metrics(self):
        """Prometheus text whose counter is how many /metrics requests had arrived, answered 50 ms later (so
        that scrapes overlap)."""
        with self.server.lock:
            self.server.scrapes += 1
            n = self.server.scrapes
        time.sleep(0.05)
        self._plain(200, f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {n}.0\n".encode())

    def do_POST(self):
        self.server.requests.append(("POST", self.path))
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        scenario = self.path.strip("/").split("/")[0]
        getattr(self, "_" + scenario.replace("-", "_"), lambda: self._plain(404, b"no such scenario"))()

    def _plain(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _sse_head(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()

    def _ok(self):
        self._sse_head()
        for piece in ("Hello", ",", " world"):
            self.wfile.write(_chunk(piece))
        self.wfile.write(_chunk("", "stop") + b"data: [DONE]\n\n")

    def _bad_json(self):
        self._sse_head()
        self.wfile.write(_chunk("Hi") + b"data: {\"choices\": [\n\n")

    def _server_error(self):
        self._plain(500, b"{\"error\": \"out of memory\"}", "application/json")

    def _html(self):
        self._plain(200, b"<!doctype html><html><body>Welcome to nginx!</body></html>", "text/html")

    def _huge(self):
        self._sse_head()
        self.wfile.write(_chunk("Hi"))
        self.wfile.write(b"data: \"" + b"x" * (4 * 1024 * 1024))   # one line of 4 MB, never ended
        self.wfile.flush()

    def _never_ends(self):
        """Valid events, a keep-alive comment every 0.1 s, forever (until the client goes)."""
        self._sse_head()
        try:
            self.wfile.write(_chunk("Hi"))
            while not self.server.closing:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def _stalls(self):
        """One token, then silence (until the client goes)."""
        self._sse_head()
        self.wfile.write(_chunk("Hi"))
        self.wfile.flush()
        while not self.server.closing:
            time.sleep(0.05)

    def _vllm(self):
        """vLLM's stream with return_token_ids: a role chunk with the prompt's ids (37 of them), a chunk per step
        with its token ids, the usage."""
        self._sse_head()
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                   "prompt_token_ids": list(range(1, 38))}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": text}, "token_ids": [500 + i],
                                 "finish_reason": "length" if i == 2 else None}]}
                   for i, text in enumerate(("The", " capital", " is"))]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 3, "total_tokens": 40}})
        self.wfile.write(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n")

    def _no_done(self):
        self._sse_head()
        self.wfile.write(_chunk("Hi") + _chunk("", "stop"))


class HostileEngine:
    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.requests = []
        self.httpd.closing = False
        self.httpd.scrapes = 0                 # /counting/metrics requests
        self.httpd.lock = threading.Lock()
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}/v1"

    @property
    def scrapes(self) -> int:
        return self.httpd.scrapes

    @property
    def requests(self) -> list:
        return self.httpd.requests

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.closing = True
        self.httpd.shutdown()
        self.httpd.server_close()
