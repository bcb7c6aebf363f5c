"""No upload holds the event loop (app/routers/teach/replay.py, app/views/recording_file.py): a recording is read
a value at a time and checked field by field in a worker thread, a few at a time, and its answer is written a
frame at a time, so that every stream of the room goes on meanwhile."""
from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import threading
import time

import pytest
from fastapi.testclient import TestClient
from websockets.sync.client import connect

from app.config import AppConfig
from app.main import create_app
from cli.bench.faults_bodies import big_recording
from engine.serving.session import GenerationSession
from live_server import serve

FORMAT = {"format": "decoding-playground/recording", "version": 1}
PROMPT = "def parse(line):\n    "
UPLOAD_BYTES = 16 * 10 ** 6
# The longest a 16 MB upload, read, checked and rendered beside a streaming run, may keep one of its tokens or the
# event loop waiting.
MAX_STALL_S = 0.050
PACE = 25                         # the streaming run's tokens a second
TICK_S = 0.002


def started_event(**fields) -> dict:
    return {"type": "started", "session_id": "s", "settings": {}, "model": {"name": "m"}, "draft_model": None,
            "prompt_tokens": [{"id": 1, "text": "a"}], **fields}


def token_event(**fields) -> dict:
    return {"type": "token", "round": 1, "position": 1, "id": 5, "text": "x", "status": "accepted", "p": 0.5,
            "q": 0.4, "accept_prob": 1.0, "r": 0.3, **fields}


@pytest.fixture(scope="module")
def client(models_dir):
    with TestClient(create_app(AppConfig(models_dir=models_dir, demo="character")), base_url="http://localhost") as c:
        yield c


# --- field by field -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("events, error", [
    ([started_event(), token_event(p="0.5")], "event 1 (token): p must be a number or null, not a string"),
    ([started_event(), token_event(round=1.5)], "event 1 (token): round must be an integer, not a number"),
    ([started_event(), token_event(position=True)], "event 1 (token): position must be an integer, not a boolean"),
    ([started_event(), token_event(text=None)], "event 1 (token): text must be a string, not null"),
    ([started_event(), {k: v for k, v in token_event().items() if k != "status"}],
     "event 1 (token): status is missing"),
    ([started_event(), token_event(colour="red")], "event 1 (token): unknown field 'colour'"),
    ([started_event(prompt_tokens=[{"id": 1}, "a"])],
     "event 0 (started): prompt_tokens must be a list of objects, not a list"),
    ([started_event(), token_event(), {"type": "metrics", "values": [1, 2]}],
     "event 2 (metrics): values must be an object, not a list"),
    ([started_event(), "token"], "event 1: an object with a type, not a string"),
    ([started_event(), {"type": "nope"}], "event 1: type 'nope' is not one of started, prefill"),
])
def test_each_event_is_checked_field_by_field_and_a_bad_one_is_named(client, events, error):
    response = client.post("/teach/replays", content=json.dumps({**FORMAT, "events": events}))
    assert response.status_code == 400 and error in response.json()["error"], response.json()


@pytest.mark.parametrize("text, error", [
    ('{"format": "decoding-playground/recording", "version": 1, "created": "today", "events": []}',
     "created must be a number or null, not a string"),
    ('{"format": "decoding-playground/recording", "version": 1, "events": [{"type": "error", "message": NaN}]}',
     "event 0: NaN is not a JSON number"),
    ('{"format": "decoding-playground/recording", "version": 1, "events": [] } x', "more after the recording's end"),
    ('{"format": "decoding-playground/recording", "version": 1, "events": [{"type": "error" "message": "m"}]}',
     "event 0: Expecting ',' delimiter at character 86"),                 # (where "message" begins)
    ('{"format": "decoding-playground/recording", "version": 1, "events": [], "kv_after": [{"key": [[1]]}]}',
     "kv_after 0: an object with a key"),
])
def test_what_is_not_a_recording_is_named_with_where(client, text, error):
    response = client.post("/teach/replays", content=text.encode())
    assert response.status_code == 400 and error in response.json()["error"], response.json()


def test_a_value_is_read_from_growing_pieces_and_none_may_be_longer_than_its_limit():
    from app.views.recording import RecordingError
    from app.views.recording_file import FIRST_PIECE_CHARS, MAX_VALUE_CHARS, JsonPieces

    long_text = "é" * (FIRST_PIECE_CHARS * 5)                    # over two pieces
    number = "7" * (FIRST_PIECE_CHARS + 10)                      # its first piece ends inside it, and decodes
    reader = JsonPieces(f'[{json.dumps(long_text, ensure_ascii=False)}, {number}, {{"a": [1, 2]}}]')
    assert [reader.value(f"item {i}") for i in reader.items("list")] == [long_text, int(number), {"a": [1, 2]}]
    with pytest.raises(RecordingError, match=f"big: longer than {MAX_VALUE_CHARS:,} characters"):
        JsonPieces(json.dumps(["x" * MAX_VALUE_CHARS])).value("big")


@pytest.fixture(scope="module")
def small_recording(client) -> bytes:
    """A real run's recording file (draft model, 30 tokens), as the page exports it."""
    engine = client.app.state.playground.engine
    events = [e.to_dict() for e in GenerationSession(engine, PROMPT, {"max_tokens": 30, "method": "draft_model",
                                                                      "num_speculative_tokens": 3}).events()]
    return json.dumps({**FORMAT, "created": 1.5, "prompt": PROMPT, "settings": events[0]["settings"],
                       "complete": True, "truncated": False, "events": events, "kv_after": []}).encode()


def test_a_replayed_file_exports_as_it_came_and_replays_the_same(client, small_recording):
    first = client.post("/teach/replays", content=small_recording).json()
    assert first["rounds"] == small_recording.count(b'"type": "round"') and first["frames"]
    exported = client.get(f"/teach/recordings/{first['key']}.json").content        # written an event at a time
    assert json.loads(exported) == json.loads(small_recording)
    again = client.post("/teach/replays", content=exported).json()
    assert client.get(f"/teach/recordings/{again['key']}.json").content == exported
    assert [f.replace(again["key"], "").replace(again["key"][:8], "") for f in again["frames"]] == \
        [f.replace(first["key"], "").replace(first["key"][:8], "") for f in first["frames"]]     # but for the key


MARKUP = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


def test_markup_in_an_uploaded_recordings_strings_is_shown_as_text(client, small_recording):
    """Every text a file brings (the prompt's and output's tokens, the draft's and the top-5's texts, the model's name,
    the file's name) reaches the frames escaped: replayed, it is text, never markup that could run a script."""
    data = json.loads(small_recording)
    for e in data["events"]:
        for item in [e, *e.get("prompt_tokens", []), *e.get("tokens", [])]:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                item["text"] = MARKUP
        for name in ("top_p", "top_q", "residual_top"):
            for row in e.get(name, []):
                row[1] = MARKUP
        if e["type"] == "started":
            e["model"]["name"] = MARKUP
    response = client.post("/teach/replays", content=json.dumps(data), headers={"X-File-Name": MARKUP})
    frames = "".join(response.json()["frames"])
    assert response.status_code == 200 and "&lt;img src=x onerror" in frames
    assert "<img src=x" not in frames and "<script>alert" not in frames


def test_while_a_worker_reads_an_upload_the_gil_changes_hands_often():
    """The engine thread and the event loop each wait for the GIL up to the switch interval whenever they wake
    beside a worker: the interval is short while a worker runs, and Python's own again once none does."""
    import sys

    from app.routers.teach.common import WORKER_SWITCH_INTERVAL_S, WorkerSlots

    slots, before = WorkerSlots(size=2, wait_s=1.0), sys.getswitchinterval()
    assert before > WORKER_SWITCH_INTERVAL_S
    gate = threading.Barrier(2)

    def inside():
        gate.wait(10)                # both workers inside at once
        seen = sys.getswitchinterval()
        gate.wait(10)
        return seen

    async def two_workers():
        return await asyncio.gather(slots.run(inside), slots.run(inside))

    seen = []                        # on a thread of its own: the main thread may hold a browser test's loop
    runner = threading.Thread(target=lambda: seen.append(asyncio.run(two_workers())))
    runner.start()
    runner.join(30)
    assert seen == [[WORKER_SWITCH_INTERVAL_S] * 2]
    assert sys.getswitchinterval() == before and slots.running == 0


def test_beyond_its_turns_an_upload_waits_then_is_told_the_server_is_busy(client, small_recording, monkeypatch):
    from app.routers.teach.common import UPLOADS

    monkeypatch.setattr(UPLOADS, "wait_s", 0.2)
    held, release = threading.Event(), threading.Event()

    def hold():                      # a turn taken on the app's own loop, kept until released
        held.set()
        release.wait(30)

    async def take_every_turn():
        await asyncio.gather(*(UPLOADS.run(hold) for _ in range(UPLOADS.size)))

    portal = client.portal
    future = portal.start_task_soon(take_every_turn)
    try:
        assert held.wait(10)
        while UPLOADS.running < UPLOADS.size:
            time.sleep(0.01)
        response = client.post("/teach/replays", content=small_recording)
        assert response.status_code == 503 and response.json()["error"].startswith("busy")
        assert response.headers["retry-after"]
    finally:
        release.set()
        future.result(30)
    assert client.post("/teach/replays", content=small_recording).status_code == 200


# --- the event loop beside an upload --------------------------------------------------------------------------------
class LoopProbe:
    """The app, and the event loop it runs on (known from its first call)."""

    def __init__(self, app):
        self.app, self.loop = app, None

    async def __call__(self, scope, receive, send):
        self.loop = self.loop or asyncio.get_running_loop()
        await self.app(scope, receive, send)


async def current_thread_ids() -> tuple[int, int]:
    return threading.get_native_id(), threading.get_ident()


class LoopStalls:
    """A task on the server's event loop that asks to wake every TICK_S, and of each wake-up that came late, the
    part the loop itself was kept from: at most how late it woke, less the time its thread waited for a CPU
    meanwhile (the kernel's run delay, /proc/thread-self/schedstat), and at most the CPU time the server's own
    threads spent meanwhile (the process's, less the test's client threads'). A machine busy on every core
    delays the threads; it does not make the server do more work, so neither bound depends on it.

    Both bound the stall from above: the loop is kept from running by work on it or by a thread holding the GIL,
    and either is CPU time of the server's threads, spent while the loop's thread was not waiting for a CPU."""

    def __init__(self, client_threads: list[threading.Thread]):
        self.clients = [time.pthread_getcpuclockid(t.ident) for t in client_threads]
        self.worst = self.worst_late = 0.0
        self.ticks = 0
        self.running = True

    def server_cpu(self) -> float:
        return time.process_time() - sum(time.clock_gettime(c) for c in self.clients)

    async def run(self) -> None:
        path = "/proc/thread-self/schedstat"                 # the loop's own thread
        fd = os.open(path, os.O_RDONLY) if os.path.exists(path) else None

        def run_delay() -> float:
            return int(os.pread(fd, 200, 0).split()[1]) / 1e9 if fd is not None else 0.0

        try:
            while self.running:
                due, waited, cpu = time.perf_counter() + TICK_S, run_delay(), self.server_cpu()
                await asyncio.sleep(TICK_S)
                late = time.perf_counter() - due
                self.worst_late = max(self.worst_late, late)
                self.worst = max(self.worst, min(late - (run_delay() - waited), self.server_cpu() - cpu))
                self.ticks += 1
        finally:
            if fd is not None:
                os.close(fd)


class ThreadClock:
    """A thread's time waiting for a CPU (the kernel's run delay) and its CPU time, read from any thread."""

    def __init__(self, native_id: int, ident: int):
        self.fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
        self.cpu_clock = time.pthread_getcpuclockid(ident)

    def run_delay(self) -> float:
        return int(os.pread(self.fd, 200, 0).split()[1]) / 1e9

    def cpu(self) -> float:
        return time.clock_gettime(self.cpu_clock)


def token_stalls(tokens: list[tuple], period: float) -> list[float]:
    """Of each gap between two tokens of one paced run, the part the server's own threads kept the engine and the
    event loop from: how much later than the pace the token came, less the time the engine's and the loop's
    threads waited for a CPU meanwhile, and at most the CPU time the server's other threads spent meanwhile
    (whoever holds the GIL the engine waits for is one of them, and is running). A busy machine delays the
    threads; it does not make the server do more work, so neither bound depends on it."""
    return [min(b[1] - a[1] - period - (b[2] - a[2]) - (b[3] - a[3]), b[4] - a[4])
            for a, b in zip(tokens, tokens[1:]) if a[0] == b[0]]


def test_a_16_mb_upload_beside_a_streaming_run_stalls_neither_its_tokens_nor_the_event_loop_50_ms(models_dir):
    """The file is read in a process of its own; the server only makes the recording again, a few events at a
    time (app/routers/teach/replay.py)."""
    app = create_app(AppConfig(models_dir=models_dir, demo="character"))
    probe = LoopProbe(app)
    with serve(probe) as base:
        for thread in threading.enumerate():            # start-up's own work done (the models warmed up)
            if thread.name == "warm-up":
                thread.join(120)
        engine = app.state.playground.engine
        events = [e.to_dict() for e in GenerationSession(engine, PROMPT, {"max_tokens": 120, "method": "draft_model",
                                                                          "num_speculative_tokens": 3,
                                                                          "temperature": 1.0, "seed": 3}).events()]
        body = big_recording(events, UPLOAD_BYTES)
        assert len(body) >= UPLOAD_BYTES and body.count(b'"type":') <= 40_000

        tokens: list[tuple] = []         # (run, arrival, the engine's and the loop's run delays, others' CPU)
        streaming, stop = threading.Event(), threading.Event()
        loop_thread = asyncio.run_coroutine_threadsafe(current_thread_ids(), probe.loop).result(10)
        loop_clock, clocks = ThreadClock(*loop_thread), []

        def stream():                     # paced runs, one after another: tokens all through the upload
            with connect(base.replace("http://", "ws://") + "/api/ws", max_size=2 ** 24) as ws:
                for run in itertools.count():
                    ws.send(json.dumps({"type": "start", "prompt": PROMPT, "speed": PACE,
                                        "settings": {"max_tokens": 480, "method": "none"}}))
                    while not stop.is_set():
                        message = json.loads(ws.recv(timeout=30))
                        if message["type"] == "token":
                            if clocks:
                                engine_clock, others = clocks[0]
                                tokens.append((run, time.monotonic(), engine_clock.run_delay(),
                                               loop_clock.run_delay(), others.server_cpu() - engine_clock.cpu()))
                            streaming.set()
                        assert message["type"] != "error", message
                        if message["type"] == "done":
                            break
                    if stop.is_set():
                        break
                ws.send(json.dumps({"type": "stop"}))

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        assert streaming.wait(30)
        stalls = LoopStalls([threading.current_thread(), streamer])
        engine_thread = next(t for t in threading.enumerate() if t.name == "engine")
        clocks.append((ThreadClock(engine_thread.native_id, engine_thread.ident), stalls))
        ticker = asyncio.run_coroutine_threadsafe(stalls.run(), probe.loop)
        host, port = base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=300)
        upload_started = time.monotonic()
        connection.request("POST", "/teach/replays", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()              # (bytes only: parsing them here would hold this process's GIL)
        upload_done = time.monotonic()
        stalls.running = False
        ticker.result(10)
        stop.set()
        streamer.join(30)
    assert response.status == 200, answer[:300]
    assert json.loads(answer)["rounds"] == body.count(b'"type":"round"')
    during = [t for t in tokens if upload_started < t[1] < upload_done]
    assert len(during) > 10                                                     # the run went on meanwhile
    assert stalls.ticks > 100
    assert stalls.worst < MAX_STALL_S, (stalls.worst, stalls.worst_late, upload_done - upload_started)
    assert max(token_stalls(during, 1 / PACE)) < MAX_STALL_S, sorted(token_stalls(during, 1 / PACE))[-5:]
