"""`decoding-playground bench faults`: what careless and hostile clients cost a real server: `stuck`, `prefill`,
`fuzz`; `bodies` and `uploads` in faults_bodies.py.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import socket
import statistics
import time
import urllib.request

from cli.bench import faults_bodies
from cli.bench.lib import add_bench, ms_shown, s_shown, table
from cli.bench.served import TOKEN, Server, get_json, wait_until_loaded
from engine.serving.scheduler import CHUNK_SECONDS

PROMPT = "def main(argv):\n    "
LONG_TEXT = ("Explain, step by step, what this function does, which inputs break it, and how to test it.\n\n"
             "def merge_intervals(intervals):\n    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
             "    merged = []\n    for start, end in intervals:\n        if merged and start <= merged[-1][1]:\n"
             "            merged[-1][1] = max(merged[-1][1], end)\n        else:\n"
             "            merged.append([start, end])\n    return merged\n\n")
SMOLLM2 = "smollm2-135m"


def add_parser(bench_subparsers) -> None:
    bp = add_bench(bench_subparsers, "faults", "stuck clients, a long prefill beside a bystander, fuzzed forms: what "
                   "they cost a real server", run, tables, models_dir=True)
    bp.add_argument("--repeats", type=int, default=3, help="long-prefill runs per server (default 3)")
    bp.add_argument("--forms", type=int, default=600, help="fuzzed /ws forms (default 600)")
    bp.add_argument("--budgets", default="0,time,8,64,256",
                    help="prefill budgets compared, --max-num-batched-tokens of a server each (0: whole prefills; "
                         "time: the default, chunks sized in time)")
    bp.add_argument("--parts", default="stuck,prefill,fuzz,bodies,uploads", help="which parts to run (default all; "
                    "bodies, uploads: cli/bench/faults_bodies.py)")
    bp.add_argument("--uploads", type=int, default=4, help="recordings posted at once in the upload probe (default 4)")
    bp.add_argument("--upload-mb", type=float, default=16, help="size of each (default 16)")


async def poll(predicate, timeout: float, every: float = 0.02):
    """The first true value of `predicate()` within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        await asyncio.sleep(every)


async def until(ws, *types: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic())))
        if message["type"] in types:
            return message


# --- a client that never reads --------------------------------------------------------------------------------
class RawWebSocket:
    """A websocket client on a plain socket with a small receive buffer: it reads the handshake's answer and
    then never reads again (a stalled or hostile client). `send` says whether the socket still took it.

    Its segments are small too (TCP_MAXSEG 536, as on a poor link): the server's kernel sizes its send buffer
    by the connection's segments, so it holds tens of KiB for this client, not the megabytes of a loopback
    connection, which would swallow a whole generation of our small models before the server noticed."""

    def __init__(self, base: str, path: str, receive_buffer: int = 4096):
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.settimeout(10)
        self.sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):        # byte by byte: nothing after the answer is read
            byte = self.sock.recv(1)
            if not byte:
                raise ConnectionError("closed during the handshake")
            head += byte
        self.status = int(head.split()[1])

    def send(self, message: dict) -> bool:
        data, mask = json.dumps(message).encode(), os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
        try:
            self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()


STUCK_SETTINGS = {"max_tokens": 500, "method": "none"}   # a round per token: the most bytes per token


def stats_are(srv: Server, **expected) -> float | None:
    """The time, if `/api/stats` has these values now."""
    stats = srv.stats()
    return time.monotonic() if all(stats[k] == v for k, v in expected.items()) else None


def generation_tokens(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("vllm:generation_tokens_total"))


async def stuck_client(models_dir: str | None = None) -> dict:
    """The stuck-client figures (see the module's docstring); times in seconds after the 1008 decision."""
    import websockets

    with Server("--max-sessions", "1", "--max-queue", "4", models_dir=models_dir) as srv:
        stuck = RawWebSocket(srv.base, "/api/ws")
        stuck.send({"type": "start", "prompt": PROMPT, "settings": STUCK_SETTINGS})
        assert await poll(lambda: srv.stats()["sessions"] == 1, 30), "the stuck client's generation never started"
        async with websockets.connect(srv.ws(), open_timeout=10) as normal:
            await normal.send(json.dumps({"type": "start", "prompt": PROMPT, "settings": {"max_tokens": 5},
                                          "paused": True}))
            await until(normal, "queued", timeout=10)
            flood, deadline, times = 0, time.monotonic() + 60, {}
            while srv.logged(event="ws_closed_by_server", code=1008) is None and time.monotonic() < deadline:
                if not stuck.send({"type": "speed", "speed": "max"}):
                    break                      # the server has closed it (the log line is on its way)
                flood += 1
                await asyncio.sleep(1 / 80)
            decided = await poll(lambda: srv.logged(event="ws_closed_by_server", code=1008), 10)
            assert decided, f"no 1008 after {flood} messages"
            started = asyncio.create_task(until(normal, "started", timeout=30))
            started.add_done_callback(lambda _: times.setdefault("started", time.monotonic()))
            # `normal` holds the slot now, paused before its prefill: no blocks
            freed = await poll(lambda: stats_are(srv, sessions=1, waiting=0, kv_blocks_used=0), 30)
            gone = await poll(lambda: stats_are(srv, connections=1), 12)
            await started
            # a second client that never reads, blocked in the middle of its generation (queued behind `normal`)
            blocked = RawWebSocket(srv.base, "/api/ws")
            blocked.send({"type": "start", "prompt": PROMPT, "settings": STUCK_SETTINGS})
            await poll(lambda: srv.stats()["waiting"] == 1, 10)
            await normal.send(json.dumps({"type": "resume"}))
            await until(normal, "done", timeout=30)

            async def held() -> bool:       # its session is there and makes no progress: its client holds it
                before = generation_tokens(srv.base)
                await asyncio.sleep(0.5)
                return srv.stats()["sessions"] == 1 and generation_tokens(srv.base) == before
            deadline = time.monotonic() + 30
            while not await held():
                assert time.monotonic() < deadline, ("the never-reading client's generation was not held", srv.stats(),
                                                     generation_tokens(srv.base))
            shutdown = srv.stop()
        stuck.close()
        blocked.close()
    return {"flood_messages": flood, "freed_s": freed and freed - decided, "gone_s": gone and gone - decided,
            "queued_started_s": times["started"] - decided, "shutdown_s": shutdown}


# --- a long prefill beside a bystander --------------------------------------------------------------------------
def long_prompt(models: list[dict]) -> tuple[dict, str]:
    """Settings and prompt of the long prefill (SmolLM2 chat, else our target near its context), prefix cache off."""
    settings = {"method": "none", "max_tokens": 1, "enable_prefix_caching": False}
    if any(m["name"] == SMOLLM2 for m in models):
        return {**settings, "model": SMOLLM2, "chat": True}, LONG_TEXT * 17
    return {**settings, "model": next(m for m in models if m["role"] == "target")["name"]}, LONG_TEXT


async def beside_a_long_prefill(srv: Server, settings: dict, prompt: str) -> dict:
    import websockets

    async with websockets.connect(srv.ws(), open_timeout=10, max_size=2 ** 24) as long, \
            websockets.connect(srv.ws(), open_timeout=10) as bystander:
        sent = time.monotonic()
        await long.send(json.dumps({"type": "start", "prompt": prompt, "settings": settings}))
        times: dict = {}

        async def follow_long() -> None:
            while "token" not in times:
                message = json.loads(await long.recv())
                if message["type"] in ("started", "token", "error") and message["type"] not in times:
                    times[message["type"]] = time.monotonic() - sent
                    if message["type"] == "started":
                        times["prompt_tokens"] = len(message["prompt_tokens"])
                if message["type"] == "error":
                    raise RuntimeError(message["message"])
        follower = asyncio.create_task(follow_long())
        assert await poll(lambda: srv.stats()["engine"]["scheduled"] >= 1, 60), "the engine never took the prompt"
        asked = time.monotonic()
        await bystander.send(json.dumps({"type": "start", "prompt": PROMPT, "settings": {"max_tokens": 4}}))
        await until(bystander, "token", timeout=600)
        ttft = time.monotonic() - asked
        await asyncio.wait_for(follower, 600)
    return {"bystander_ttft_s": ttft, "long_started_s": times["started"], "long_first_token_s": times["token"],
            "prompt_tokens": times["prompt_tokens"]}


async def long_prefill(repeats: int, budgets: list[str], models_dir: str | None = None) -> dict:
    """A server per budget (`--max-num-batched-tokens`; 0: whole prefills, time: the default), runs interleaved."""
    servers = {b: Server(*(() if b == "time" else ("--max-num-batched-tokens", b)), models_dir=models_dir)
               for b in budgets}
    try:
        for srv in servers.values():
            wait_until_loaded(srv.base)
        settings, prompt = long_prompt(get_json(servers[budgets[0]].base + "/api/models")["models"])
        runs: dict[str, list] = {b: [] for b in budgets}
        for i in range(repeats):
            for b in budgets[i % len(budgets):] + budgets[:i % len(budgets)]:
                runs[b].append(await beside_a_long_prefill(servers[b], settings, prompt))
    finally:
        for srv in servers.values():
            srv.stop()
    med = statistics.median
    out = {"model": settings["model"], "prompt_tokens": runs[budgets[0]][0]["prompt_tokens"], "repeats": repeats,
           "chunk_ms": CHUNK_SECONDS * 1e3, "budgets": {}}
    for b, rs in runs.items():
        out["budgets"][b] = {k: med([r[k] for r in rs])
                             for k in ("bystander_ttft_s", "long_started_s", "long_first_token_s")}
        out["budgets"][b]["bystander_ttft_max_s"] = max(r["bystander_ttft_s"] for r in rs)
    return out


# --- fuzzed forms on /ws ------------------------------------------------------------------------------------------
FORM = {"prompt": PROMPT, "speed": "20", "model": "", "num_kv_heads": "", "max_tokens": "60", "temperature": "0",
        "top_p": "1", "seed": "0", "method": "draft_model", "num_speculative_tokens": "3",
        "num_speculative_tokens_schedule": "constant", "prompt_lookup_min": "1", "prompt_lookup_max": "4",
        "kv_cache": ["false", "true"], "kv_cache_dtype": "auto", "block_size": "16",
        "enable_prefix_caching": ["false", "true"], "HEADERS": {"HX-Request": "true"}}
HUGE = "<an integer of 5,000 digits>"
# A form, its probe and the acknowledgements of what arrives meanwhile: well under the server's 100 messages a
# second per connection (docs/protocol.md), which would drop a probe.
FUZZ_INTERVAL_S = 0.05
SUMMARY = re.compile(r'<div id="summary"[^>]*><strong>[^<]*</strong> (\d+) tokens in')   # after `done`


def mutated_form(rng: random.Random) -> str:
    """The playground form with one to three fields (or the action, or the whole message) made odd."""
    odd = [None, True, -1, 0, 3.5, HUGE, "", " ", "\ud800", "max", "nan", "1e309", "-0", "x" * 9000, [], [[1]],
           [None], {}, {"a": 1}, ["false"], "<script>alert(1)</script>", "{{7*7}}", "16", "draft_model", "ngram",
           "int8", "fp8", "none", "2", "0.5"]
    form = json.loads(json.dumps(FORM))
    roll = rng.random()
    if roll < 0.05:
        return rng.choice(['[1, 2]', '"form"', '{"prompt": ', '{"ack": "x"}', '{"ack": -1}', "null", "{}",
                           '{"action": []}', '{"action": {"a": 1}}', '{"action": "explode"}', "9" * 5000])
    for _ in range(rng.randint(1, 3)):
        name = rng.choice([*FORM, "action", "unknown_field"])
        value = rng.choice(odd)
        if name == "action" and isinstance(value, str) and value in ("toggle", "start", "step", "stop", "reset"):
            value = "explode"
        form[name] = value
    return json.dumps(form).replace(f'"{HUGE}"', "9" * 5000)     # an integer json.loads refuses to convert


async def fuzz_forms(base: str, n: int, seed: int = 19) -> dict:
    """`n` mutated forms on /ws, each followed by a probe, while generations run and are checked."""
    import websockets

    rng = random.Random(seed)
    counts = {"forms": n, "answered": 0, "errors": 0, "runs_checked": 0, "tokens_lost": 0, "runs_short": 0}
    received = 0
    async with websockets.connect(base.replace("http://", "ws://") + "/ws", open_timeout=10,
                                  max_size=2 ** 24) as ws:
        shown = 0                                     # tokens of the current run seen in the stream

        async def read_until(needle: str | None) -> None:
            """Messages until one holding `needle` (None: any one); error notes and finished runs counted."""
            nonlocal received, shown
            while True:
                text = await asyncio.wait_for(ws.recv(), 30)
                received += 1
                await ws.send(json.dumps({"ack": received}))           # as the page does
                if 'id="stream"' in text:
                    shown = 0
                shown += sum(status != "rejected" for status in TOKEN.findall(text))
                counts["errors"] += text.count('data-note="error"')
                if (summary := SUMMARY.search(text)) is not None:
                    counts["runs_checked"] += 1
                    counts["tokens_lost"] += int(summary.group(1)) - shown
                    counts["runs_short"] += int(summary.group(1)) != shown
                    await ws.send(json.dumps({**FORM, "action": "toggle"}))     # the next run
                if "rate limit" in text:
                    raise RuntimeError("the fuzz went over the server's message rate (a probe was dropped)")
                if needle is None or needle in text:
                    return

        await read_until(None)                                             # hello
        await ws.send(json.dumps({**FORM, "action": "toggle"}))
        await read_until('data-state="running"')
        for i in range(n):
            next_at = time.monotonic() + FUZZ_INTERVAL_S
            await ws.send(mutated_form(rng))
            await ws.send(json.dumps({"action": f"probe-{i}"}))
            await read_until(f"probe-{i}")
            counts["answered"] += 1
            counts["errors"] -= 1                      # the probe's own error
            await asyncio.sleep(next_at - time.monotonic())
    return counts


# --- output --------------------------------------------------------------------------------------------------------
def tables(r: dict) -> list[str]:
    out = []
    if "stuck" in r:
        st = r["stuck"]
        out.append(table(["stuck client (`--max-sessions 1`, 4 KiB receive buffer, never reads)", ""], [
            ["`speed` messages until the server closed it (1008)", st["flood_messages"]],
            ["its session and KV blocks freed (`/api/stats`), after the 1008", s_shown(st["freed_s"])],
            ["its connection gone (`/api/stats`), after the 1008", s_shown(st["gone_s"])],
            ["the client queued behind it got `started`, after the 1008", s_shown(st["queued_started_s"])],
            ["SIGTERM to exit, with it and a second never-reading client (held mid-generation) open",
             s_shown(st["shutdown_s"])]]))
    if "prefill" in r:
        lp = r["prefill"]
        whole = lp["budgets"].get("0")
        out.append(table(["`--max-num-batched-tokens`", "bystander TTFT", "(max)", "long prompt's `started`",
                          "long prompt's first token", "vs whole"],
                         [[{"0": "0 (whole prefills)", "time": f"none (the default: {lp['chunk_ms']:.0f} ms chunks)"}
                           .get(b, b), ms_shown(x["bystander_ttft_s"] * 1e3),
                           ms_shown(x["bystander_ttft_max_s"] * 1e3), ms_shown(x["long_started_s"] * 1e3),
                           s_shown(x["long_first_token_s"]),
                           f"{x['long_first_token_s'] / whole['long_first_token_s']:.2f}×" if whole else None]
                          for b, x in lp["budgets"].items()],
                         f"Long prefill: {lp['prompt_tokens']:,} prompt tokens on {lp['model']} beside a bystander on our "
                         f"own target, {lp['repeats']} runs per budget taking turns (medians)"))
    if "fuzz" in r:
        fz = r["fuzz"]
        out.append(table(["mutated forms", "answered", "error notes", "runs checked", "tokens lost", "runs short"],
                         [[fz[k] for k in ("forms", "answered", "errors", "runs_checked", "tokens_lost", "runs_short")]],
                         "Fuzz (`/ws`, seed 19), each form followed by a probe that must be answered"))
    return out + faults_bodies.tables(r)


def run(args) -> dict:
    parts = args.parts.split(",")
    r = {}
    if "stuck" in parts:
        r["stuck"] = asyncio.run(stuck_client(args.models_dir))
    if "prefill" in parts:
        budgets = [b.strip() for b in args.budgets.split(",")]
        if any(b != "time" and not b.isdigit() for b in budgets):
            raise SystemExit(f"--budgets: token counts or 'time', got {args.budgets!r}")
        r["prefill"] = asyncio.run(long_prefill(args.repeats, budgets, args.models_dir))
    if "fuzz" in parts:
        with Server(models_dir=args.models_dir) as srv:
            r["fuzz"] = asyncio.run(fuzz_forms(srv.base, args.forms))
    if "bodies" in parts:
        r["bodies"] = faults_bodies.body_probes(args.models_dir)
    if "uploads" in parts:
        r["uploads"] = faults_bodies.upload_probe(args.models_dir, args.uploads, int(args.upload_mb * 10 ** 6))
    return r
