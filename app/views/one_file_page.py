"""A run saved as one page: a recording (app/views/recording.py) as a single HTML file that plays without us.

The file holds the page's own stylesheets and scripts (static/app.css, slides.css and teach.css; playground.js,
latency_chart.js and the player, standalone.js) and the run's frames: the very messages the live page received
(app/views/replay.py), so it plays as the page showed it — stream, draft lane, KV map, gauges, chart — from disk
(`file://`), with no server and no network. The frames are gzip-compressed and base64-encoded (they repeat
themselves: a 400-token run's 570 KB of frames are 20 KB so, docs/teaching.md), unpacked by the browser's own
DecompressionStream; `compress=False` writes them as plain JSON for browsers without it.

Its presentation comes from the page that saved it (`layout`, `presenter`, `theme`, `hide`, `speed`, `autoplay`,
as on /embed), and the file's own query string overrides them (`run.html?layout=stream&presenter=1`).
"""
from __future__ import annotations

import base64
import time
import zlib
from dataclasses import dataclass, field

from app.paths import STATIC_DIR
from app.views.page import DEFAULT_SPEED, HIDEABLE, LAYOUTS, SPEEDS, THEMES, PageState, gauge_rows
from app.views.recording import Recording
from app.views.replay import frames_json, replay_frames
from app.views.templating import templates

RUN_LAYOUTS = [(v, label) for v, label in LAYOUTS if not v.startswith("view:")]    # no teaching views in a file
RUN_PARTS = ("status", "legend", "stream", "draft", "kv", "gauges", "chart", "notes")
ENCODINGS = ("gzip+base64", "json")


@dataclass
class PageOptions:
    """How the saved page looks when opened (each checked: a bad value is a ValueError naming it)."""
    layout: str = ""
    presenter: bool = False
    theme: str = "light"
    hide: list[str] = field(default_factory=list)
    speed: str = DEFAULT_SPEED
    autoplay: bool = False

    def __post_init__(self):
        if self.layout not in {v for v, _ in RUN_LAYOUTS}:
            raise ValueError(f"layout: one of {', '.join(v for v, _ in RUN_LAYOUTS if v)} (or none)")
        if self.theme not in THEMES:
            raise ValueError(f"theme: {' or '.join(THEMES)}")
        if self.speed not in {s for s, _ in SPEEDS}:
            raise ValueError(f"speed: one of {', '.join(s for s, _ in SPEEDS)}")
        unknown = [h for h in self.hide if h not in RUN_PARTS]
        if unknown:
            raise ValueError(f"hide: parts of a saved run are {', '.join(RUN_PARTS)}")

    @classmethod
    def from_query(cls, query) -> "PageOptions":
        """From a page's address (`layout`, `presenter`, `theme`, `hide`, `speed`, `autoplay`); parts of the page
        that a saved run does not have (its settings, the teaching views) are left out of `hide`."""
        hide = [h.strip() for raw in (query.getlist("hide") if hasattr(query, "getlist") else [query.get("hide") or ""])
                for h in (raw or "").split(",") if h.strip() in RUN_PARTS]
        truthy = ("1", "true", "yes", "on")
        return cls(layout=query.get("layout") or "", presenter=(query.get("presenter") or "").lower() in truthy,
                   theme=query.get("theme") or "light", hide=hide, speed=query.get("speed") or DEFAULT_SPEED,
                   autoplay=(query.get("autoplay") or "").lower() in truthy)


def encode_frames(frames: list[str], compress: bool = True) -> tuple[str, str]:
    """The frames as the page's `<script type="application/json">` holds them: (encoding, text). Plain JSON has
    `<` escaped, so that no frame can end the script element. Written and compressed a frame at a time, so
    that the thread doing it lets the GIL go (app/views/replay.py's `frames_json`)."""
    if compress:
        gz = zlib.compressobj(9, zlib.DEFLATED, 31)         # 31: a gzip member (header with no time: the same bytes)
        packed = [gz.compress(piece.encode("utf-8", "replace")) for piece in frames_json(frames)] + [gz.flush()]
        return "gzip+base64", base64.b64encode(b"".join(packed)).decode()
    return "json", "".join(piece.replace("<", "\\u003c") for piece in frames_json(frames))


def _static(name: str) -> str:
    return (STATIC_DIR / name).read_text(encoding="utf-8")


def _inline(text: str, tag: str) -> str:
    """A stylesheet or script as the body of an inline element: nothing in it may close that element."""
    return text.replace(f"</{tag}", f"<\\/{tag}")


def describe(recording: Recording) -> dict:
    """What the page says of the run: its model, method, size and date."""
    started, done = recording.started, recording.last("done")
    s = recording.settings
    method = s.get("method", "none")
    drafting = "plain decoding" if method == "none" else f"{method.replace('_', ' ')}, γ {s.get('num_speculative_tokens')}"
    tokens = done.summary["num_output_tokens"] if done is not None else None
    return {"model": (started.model or {}).get("name", "?") if started else "?", "drafting": drafting,
            "tokens": tokens, "rounds": recording.num_rounds, "complete": recording.complete,
            "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(recording.created))}


def standalone_page(recording: Recording, options: PageOptions | None = None, compress: bool = True) -> str:
    """The recording as one self-contained HTML page (the same recording and options: the same bytes)."""
    options = options or PageOptions()
    encoding, frames = encode_frames(replay_frames(recording), compress)
    state = PageState(values={}, defaults={}, speed=options.speed, theme=options.theme, presenter=options.presenter,
                      hide=sorted(set(options.hide) | {"header", "sidebar", "views", "footer"}), layout=options.layout)
    context = {"state": state, "layouts": RUN_LAYOUTS, "gauge_rows": gauge_rows(), "speeds": SPEEDS,
               "standalone": True, "run": describe(recording), "autoplay": options.autoplay,
               "frames": frames, "encoding": encoding, "hideable": HIDEABLE,
               "css": _inline("\n".join(_static(name) for name in ("app.css", "slides.css", "teach.css")), "style"),
               "scripts": [_inline(_static(name), "script")
                           for name in ("playground.js", "latency_chart.js", "standalone.js")]}
    return templates.env.get_template("standalone.html").render(context)
