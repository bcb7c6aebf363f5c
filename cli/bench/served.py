"""A real server for the benchmarks: `decoding-playground serve` in its own process (so that the clients' own Python
does not share its GIL), on a free port of 127.0.0.1, its JSON log lines kept as they arrive; and clients of its
/api/ws: one generation at full speed, many at once, their figures pooled over repeats
(engine/experiments/serve_figures.py)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

from engine.experiments.serve_figures import figures, merge, ms, p50_p99, pcts  # noqa: F401 - the benches' from here


def get_json(url: str, timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
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


# --- clients of /api/ws --------------------------------------------------------------------------------------------
# what the page's fragments on /ws and /watch say: a token's status, and the end of the run
TOKEN = re.compile(r'<span class="tok" data-token-status="(\w+)"')
RUN_DONE = re.compile(r'id="run-status"[^>]*data-state="done"')
PROMPTS = ["def fibonacci(n):\n    ", "class Stack:\n    def __init__(self", "import os\nimport sys\n\ndef main(",
           "for i in range(10):\n    print(", "def parse_args(argv):\n    parser = ", "x = [1, 2, 3]\ny = ",
           "def read_file(path):\n    with open(", "while True:\n    line = "]


async def client(ws_base: str, i: int, settings: dict, start_at: asyncio.Event | None = None,
                 key: str | None = None, timeout_s: float = 600.0, prompt: str | None = None) -> dict:
    """One generation on /api/ws at full speed (of `prompt`, or the i-th of PROMPTS); times are this client's own
    clock (perf_counter); `summary`: the run's own figures from its `done`."""
    import websockets

    out = {"ok": False, "error": None, "tokens": 0, "ttft_s": None, "itl_s": [], "tpot_s": None}
    url = ws_base + "/api/ws" + (f"?key={key}" if key else "")
    try:
        async with websockets.connect(url, max_size=2 ** 24, open_timeout=30, ping_timeout=60,
                                      compression=None) as ws:
            if start_at is not None:
                await start_at.wait()
            t0 = time.perf_counter()
            prompt = PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) if prompt is None else prompt
            await ws.send(json.dumps({"type": "start", "prompt": prompt,
                                      "settings": settings, "speed": "max"}))
            first = last_round = None
            async with asyncio.timeout(timeout_s):
                async for message in ws:
                    t = time.perf_counter()
                    # the message's `type` without parsing it all (each starts with {"type":"...")
                    kind = message[9:message.index('"', 9)] if message.startswith('{"type":"') else ""
                    if kind == "token" and first is None and '"status":"rejected"' not in message:
                        first = t
                    elif kind == "metrics":
                        if last_round is not None:
                            out["itl_s"].append(t - last_round)
                        last_round = t
                    elif kind in ("done", "error"):
                        data = json.loads(message)
                        if kind == "error":
                            out["error"] = data["message"]
                            break
                        out.update(ok=True, tokens=data["num_output_tokens"], wall_s=t - t0, text=data.get("text"),
                                   ttft_s=(first - t0) if first else None,
                                   mean_acceptance_length=data.get("mean_acceptance_length"),
                                   started_at=t0, done_at=t, watch_id=data.get("watch_id"), summary=data)
                        if first is not None and data["num_output_tokens"] > 1:
                            out["tpot_s"] = (t - first) / (data["num_output_tokens"] - 1)
                        break
                    elif kind == "started" and key:
                        out["watch_id"] = json.loads(message).get("watch_id")
    except Exception as e:  # noqa: BLE001 - any failure is this client's error
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def many(ws_base: str, n: int, settings: dict, prompts: list[str] | None = None) -> dict:
    gate = asyncio.Event()
    tasks = [asyncio.create_task(client(ws_base, i, settings, gate, prompt=prompts and prompts[i])) for i in range(n)]
    await asyncio.sleep(0.5)              # let every client connect, then start them together
    gate.set()
    return figures(n, await asyncio.gather(*tasks))
