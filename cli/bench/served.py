"""A real server for the benchmarks: `decoding-playground serve` in its own process (so that the clients'
own Python does not share its GIL), on a free port of 127.0.0.1, its JSON log lines kept as they arrive."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


class Server:
    """`decoding-playground serve ARGS` on a free port; its JSON log lines are kept with their arrival times."""

    def __init__(self, *args: str, models_dir: str | None = None, start_timeout_s: float = 120.0):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "cli.main", "serve", "--port", str(self.port), "--log-format", "json", *args]
        if models_dir:
            cmd += ["--models-dir", str(models_dir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
                                     cwd=Path(__file__).resolve().parents[2])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log: list[tuple[float, dict]] = []
        threading.Thread(target=self._read_log, daemon=True).start()
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                get_json(self.base + "/healthz")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the server did not start (try: decoding-playground serve)") from None
                time.sleep(0.1)

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            if line.startswith("{"):
                try:
                    self.log.append((time.monotonic(), json.loads(line)))
                except ValueError:
                    pass

    def logged(self, **fields) -> float | None:
        """When a log line with these fields arrived (None: not yet)."""
        return next((t for t, line in list(self.log) if all(line.get(k) == v for k, v in fields.items())), None)

    def stats(self) -> dict:
        return get_json(self.base + "/api/stats")

    def ws(self, path: str = "/api/ws") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def stop(self, timeout: float = 15.0) -> float | None:
        """SIGTERM; the seconds until the process ended (None: it did not, and was killed)."""
        if self.proc.poll() is not None:
            return 0.0
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            return time.monotonic() - t
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until_loaded(base: str, model: str | None = None, timeout_s: float = 300.0) -> dict:
    """Until the server has loaded `model` (None: every model; vLLM's: until it is ready), as sessions on a loading
    model take GBs: its entry in /api/models (None: {name: entry})."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = {m["name"]: m for m in get_json(base + "/api/models")["models"]}
        if model is not None and model not in models:
            raise SystemExit(f"the server offers no model {model!r}: {', '.join(models)}")
        asked = {name: m for name, m in models.items() if model in (None, name)}
        if any(m.get("state") == "failed" for m in asked.values()):
            raise SystemExit(f"{model or 'a model'} failed to start: {[m.get('error') for m in asked.values()]}")
        if not any(m.get("loading") or m.get("ready") is False for m in asked.values()):
            return asked[model] if model else asked
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model or 'the models'} did not load within {timeout_s:.0f} s")
        time.sleep(0.2)


@contextmanager
def per_thread_count(model: str, counts, *args: str, models_dir=None):
    """{count: a `Server` with `--threads count`}, all started and loaded, to take turns."""
    with ExitStack() as stack:
        servers = {t: stack.enter_context(Server("--threads", str(t), "--no-llamacpp", *args, models_dir=models_dir))
                   for t in counts}
        for s in servers.values():
            wait_until_loaded(s.base, model)
        yield servers
        ran = {t: wait_until_loaded(s.base, model).get("threads", t) for t, s in servers.items()}
        if any(ran[t] != t for t in ran):
            raise RuntimeError(f"a server ran another thread count than asked: {ran}")
