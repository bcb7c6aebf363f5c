"""Replay: a recorded run (app/views/recording.py) as the messages the page received live, one per round, no engine.

`replay_frames` runs the page's own view (app/views/html.py) over the recorded events, cut into rounds as the
live connection delivered them; static/teach.js swaps the frames in at the speed the viewer picks. The same
recording always gives the same frames.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from app.protocol import Batch, Notice, RenderContext
from app.views.html import HtmlView
from app.views.json import dumps
from app.views.recording import Recording, RecordingError
from app.views.templating import macros

READ_BYTES = 1 << 20
UPLOAD, ANSWER, PARTS = "upload.json", "answer.json", "recording.parts"     # read_replay's folder


class ReplayView(HtmlView):
    """HtmlView over a recording: the same fragments the live page received, round by round."""

    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording
        self.form = {"method": recording.settings.get("method")}

    def _record(self, event) -> None:          # the events are the recording's own
        pass

    def _pool_now(self, key: tuple) -> dict | None:
        """The pool as the live page drew it after the run (recorded), else its last state with this run's
        blocks given back."""
        snap = self.recording.snapshots.get(tuple(key))
        if snap is not None:
            return snap
        kv = self.recording.last("kv")
        for pool in kv.pools if kv else []:
            if (pool["name"], pool["kv_cache_dtype"], pool["block_size"]) == tuple(key):
                table = set(pool["block_table"])
                states = "".join("f" if i in table and s == "u" else s for i, s in enumerate(pool["block_states"]))
                return {**pool, "block_table": [], "block_states": states, "used": states.count("u") + states.count("s")}
        return None

    def _status_view(self) -> dict:
        view = super()._status_view()
        view["label"] = {"running": "Replaying", "done": "Replay done", "error": "Replay: error"}.get(view["state"],
                                                                                                      view["label"])
        return view


def rounds_of(events: list) -> list[list]:
    """The recording cut as the live connection delivered it: `started` alone, then each round up to and
    including its `metrics`, then the end (`done` or `error`)."""
    chunks, current = [], []
    for e in events:
        current.append(e)
        if e.type in ("started", "metrics"):
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


def replay_frames(recording: Recording) -> list[str]:
    """The HTML messages of a replay, one per round (deterministic: the same recording, the same frames)."""
    # the run id is the replay's own: the page starts its charts over when it changes (a live run's is a number)
    run_id = f"replay-{recording.key[:8]}"
    view, ctx = ReplayView(recording), RenderContext(run_id, paused=False, state="running")
    frames = []
    for i, chunk in enumerate(rounds_of(recording.events)):
        items: list = [Batch(run_id, chunk)]
        if i == 0:
            what = f"“{recording.name}”" if recording.name else "a recorded run"
            items.insert(0, Notice("note", {"kind": "replay", "text": f"replay of {what}: no engine, the "
                                                                      "recorded events as the page showed them"}))
        frames += view.render(items, ctx)
    if not recording.complete:             # an export taken mid-run: say where it ends
        view.status.update(state="done", finish="the recording ends here")
        frames.append(str(macros().status(view._status_view())))
    return frames


def frames_json(frames: list[str]) -> Iterator[str]:
    """The frames as one JSON array, written a frame at a time: a single `json.dumps` over a long run's frames
    (tens of MB) would hold the GIL, which the event loop needs, for its whole length."""
    yield "["
    for i, frame in enumerate(frames):
        yield ("," if i else "") + json.dumps(frame, ensure_ascii=False)
    yield "]"


def read_replay(folder: str, name: str | None) -> None:
    """(In a process of its own: app/routers/teach/common.py's UPLOADS.) The recording file `folder`/UPLOAD read
    and checked and its frames rendered. Written beside it: the answer as JSON (ANSWER: `{key, name, rounds,
    complete, settings, model, frames}`) and the recording in parts (PARTS, Recording.to_parts) for the server to
    keep. Files, not the answer of a call: a pipe's tens of MB would be read and copied with the server's GIL held."""
    folder = Path(folder)
    with open(folder / UPLOAD, "rb") as file:
        rec = Recording.read(iter(lambda: file.read(READ_BYTES), b""), name)
    try:
        frames = replay_frames(rec)
    except Exception as e:  # noqa: BLE001 - a file with events of the right kinds but wrong contents inside them
        error = RecordingError(f"its events do not render ({type(e).__name__})")
        error.detail = f"{type(e).__name__}: {e}"          # for the server's log, not for the client
        raise error from None
    started = rec.started
    head = dumps({"key": rec.key, "name": rec.name, "rounds": rec.num_rounds, "complete": rec.complete,
                  "settings": rec.settings, "model": started.model.get("name") if started else None})
    with open(folder / ANSWER, "wb") as file:
        for piece in [head[:-1], ',"frames":', *frames_json(frames), "}"]:
            file.write(piece.encode("utf-8", "replace"))
    with open(folder / PARTS, "wb") as file:
        for part in rec.to_parts():
            file.write(len(part).to_bytes(8, "little") + part)


def recording_parts(folder: str) -> Iterator[bytes]:
    """The parts `read_replay` wrote, one at a time."""
    with open(Path(folder) / PARTS, "rb") as file:
        while size := int.from_bytes(file.read(8), "little"):
            yield file.read(size)
