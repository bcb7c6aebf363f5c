"""`bench faults`' body and upload probes: 400 MB bodies to a route and two forms, with the server's peak
memory; recordings of many MB posted at once beside a paced run.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cli.bench.lib import ms_shown, table
from cli.bench.served import Server, get_json, wait_until_loaded

MiB = 1 << 20
HOSTILE_BYTES = 400 * 10 ** 6
LIMITS = {"/teach/replays": "32 MiB", "/teach/race": "64 KiB", "/teach/distribution": "64 KiB"}
PROMPT = "def parse(line):\n    "
FORMAT = {"format": "decoding-playground/recording", "version": 1}
PACE = 25                          # rounds a second of the streaming run beside the uploads


# --- the server's memory, a body streamed -----------------------------------------------------------------------
def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak since the last reset) of a process, in bytes."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")        # VmHWM := VmRSS (Linux >= 4.0)


def post_streamed(base: str, path: str, total: int, chunked: bool) -> dict:
    """POST a `total`-byte body made as it is sent: status, JSON, seconds to the answer, bytes taken, Connection."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
                 f"{framing}\r\n\r\n".encode())
    started, sent = time.monotonic(), [0]
    piece = b"x" * (64 * 1024)
    frame = b"%x\r\n" % len(piece) + piece + b"\r\n" if chunked else piece

    def send_body():
        try:
            while sent[0] < total:
                sock.sendall(frame)
                sent[0] += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:                    # the server has answered and closed the connection
            pass

    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed without an answer")
            head += data
        answered = time.monotonic() - started
        head, _, body = head.partition(b"\r\n\r\n")
        headers = dict(line.lower().split(b":", 1) for line in head.split(b"\r\n")[1:])
        while len(body) < int(headers.get(b"content-length", 0)):
            body += sock.recv(65536)
    finally:
        sock.close()
        sender.join(timeout=30)
    return {"status": int(head.split()[1]), "json": json.loads(body) if body.startswith(b"{") else None,
            "s": answered, "sent": sent[0], "connection": headers.get(b"connection", b"").strip() or None}


def body_probes(models_dir=None) -> list[dict]:
    rows = []
    with Server(models_dir=models_dir) as srv:
        wait_until_loaded(srv.base)
        pid = srv.proc.pid
        for path in LIMITS:
            for chunked in (True, False):
                before = memory(pid)["VmRSS"]
                reset_peak(pid)
                r = post_streamed(srv.base, path, HOSTILE_BYTES, chunked)
                rows.append({"route": f"POST {path}", "framing": "chunked" if chunked else "Content-Length",
                             "status": r["status"], "error": (r["json"] or {}).get("error"), "s": r["s"],
                             "sent_mb": r["sent"] / 1e6, "peak_mib": (memory(pid)["VmHWM"] - before) / MiB})
    return rows


# --- large uploads beside a streaming run ---------------------------------------------------------------------
def big_recording(events: list[dict], target_bytes: int) -> bytes:
    """A valid recording of about `target_bytes`: a real run's rounds repeated, each repeat numbered after the last."""
    head, rounds, tail = events[:2], events[2:-1], events[-1:]
    last_round = max(e.get("round", 0) for e in rounds)
    out, size, shift = list(head), 0, 0
    while size < target_bytes:
        for e in rounds:
            e = {**e, "round": e["round"] + shift} if "round" in e else e
            out.append(e)
            size += len(json.dumps(e, separators=(",", ":"))) + 1
        shift += last_round
    data = {**FORMAT, "created": 0, "prompt": PROMPT, "settings": head[0]["settings"], "complete": True,
            "truncated": False, "events": out + tail, "kv_after": []}
    return json.dumps(data, separators=(",", ":")).encode()


async def recorded_events(base: str, model: str) -> list[dict]:
    """The events of a run on the page's connection (/ws), from its export."""
    import websockets

    async with websockets.connect(base.replace("http://", "ws://") + "/ws", max_size=2 ** 24, open_timeout=10) as ws:
        await ws.recv()                                                    # hello
        await ws.send(json.dumps({"action": "toggle", "prompt": PROMPT, "model": model, "max_tokens": "120",
                                  "speed": "max", "method": "draft_model", "num_speculative_tokens": "3",
                                  "temperature": "1", "seed": "3", "HEADERS": {}}))
        key = None
        while True:
            text = await asyncio.wait_for(ws.recv(), 60)
            key = key or (re.search(r'data-recording="(\w+)"', text) or [None, None])[1]
            if key and 'data-complete="1"' in text:
                break
    return get_json(f"{base}/teach/recordings/{key}.json")["events"]


def upload_probe(models_dir=None, n: int = 4, size: int = 16 * 10 ** 6, baseline_s: float = 3.0) -> dict:
    from websockets.sync.client import connect
    with Server(models_dir=models_dir) as srv:
        wait_until_loaded(srv.base)
        get_json(srv.base + "/teach/curve.json", 600)       # start-up's last engine work: the demo's verify curve
        models = get_json(srv.base + "/api/models")["models"]
        model = next(m["name"] for m in models if m["role"] == "target" and not m.get("fetched"))
        body = big_recording(asyncio.run(recorded_events(srv.base, model)), size)
        tokens, health, stop = [], [], threading.Event()

        def stream():
            with connect(srv.ws(), max_size=2 ** 24) as ws:
                while not stop.is_set():       # one paced run after another, as long as the probe lasts
                    ws.send(json.dumps({"type": "start", "prompt": PROMPT, "speed": PACE,
                                        "settings": {"model": model, "max_tokens": 400, "method": "none"}}))
                    while not stop.is_set():
                        message = json.loads(ws.recv(timeout=60))
                        if message["type"] == "token":
                            tokens.append(time.monotonic())
                        if message["type"] in ("done", "error"):
                            break
                ws.send(json.dumps({"type": "stop"}))

        def poll_health():
            while not stop.is_set():
                t = time.monotonic()
                with urllib.request.urlopen(srv.base + "/healthz", timeout=60) as r:
                    r.read()
                health.append((t, time.monotonic() - t))
                time.sleep(0.05)

        def upload(i: int) -> dict:
            host, port = srv.base.removeprefix("http://").split(":")
            c = http.client.HTTPConnection(host, int(port), timeout=600)
            t = time.monotonic()
            c.request("POST", "/teach/replays", body=body, headers={"Content-Type": "application/json",
                                                                   "X-File-Name": f"probe-{i}.json"})
            r = c.getresponse()
            answer = r.read()
            return {"status": r.status, "s": time.monotonic() - t,
                    "error": json.loads(answer).get("error") if r.status != 200 else None}

        helpers = [threading.Thread(target=f, daemon=True) for f in (stream, poll_health)]
        for h in helpers:
            h.start()
        time.sleep(baseline_s)
        started = time.monotonic()
        with ThreadPoolExecutor(n) as uploaders:              # all n at once
            results = list(uploaders.map(upload, range(n)))
        ended = time.monotonic()
        stop.set()
        for h in helpers:
            h.join(60)

    def phase(lo: float, hi: float) -> dict:
        h = [d * 1e3 for t, d in health if lo <= t < hi]
        gaps = [(b - a) * 1e3 for a, b in zip(tokens, tokens[1:]) if lo <= b < hi]
        return {"healthz_p50_ms": statistics.median(h) if h else None, "healthz_max_ms": max(h, default=None),
                "token_gap_max_ms": max(gaps, default=None), "tokens": len(gaps)}
    return {"uploads": n, "mb": len(body) / 1e6, "events": body.count(b'"type":'), "results": results,
            "before": phase(started - baseline_s, started), "during": phase(started, ended), "wall_s": ended - started}


def tables(r: dict) -> list[str]:
    out = []
    if "bodies" in r:
        out.append(table(["route", "body (400 MB)", "answer", "after", "taken by the socket", "server's peak RSS"],
                         [[b["route"], b["framing"], f"{b['status']} {b['error'] or ''}".strip(),
                           ms_shown(b["s"] * 1e3), f"{b['sent_mb']:.1f} MB", f"+{b['peak_mib']:.1f} MiB"]
                          for b in r["bodies"]],
                         "Hostile bodies: 400 MB made on the fly, streamed as fast as the socket takes it"))
    if "uploads" in r:
        u = r["uploads"]
        ok = ", ".join(f"{x['s']:.1f}" for x in u["results"] if x["status"] == 200) or "–"
        answered, busy = (sum(x["status"] == code for x in u["results"]) for code in (200, 503))
        out.append(table(["", "`/healthz` p50", "`/healthz` max",
                          f"longest gap between tokens (paced {1e3 / PACE:.0f} ms)", "tokens"],
                         [[name, *map(ms_shown, (p["healthz_p50_ms"], p["healthz_max_ms"], p["token_gap_max_ms"])),
                           p["tokens"]] for name, p in (("before", u["before"]), ("during the uploads", u["during"]))],
                         f"Uploads: {u['uploads']} recordings of {u['mb']:.1f} MB ({u['events']:,} events) posted at "
                         f"once beside a streaming run: {answered} answered 200 in {ok} s, {busy} busy (503), all "
                         f"in {u['wall_s']:.1f} s"))
    return out
