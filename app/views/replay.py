"""Replay: a recorded run (app/views/recording.py) as the messages the page received live, one per round, no engine.

`replay_frames` runs the page's own view (app/views/html.py) over the recorded events, cut into rounds as the
live connection delivered them; static/teach.js swaps the frames in at the speed the viewer picks. The same
recording always gives the same frames.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from app.protocol import Batch, Notice, RenderContext
from app.views.html import HtmlView
from app.views.recording import Recording
from app.views.templating import macros


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
