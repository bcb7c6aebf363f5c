"""The words the web layer speaks: client commands, what the connection says besides the engine, and the
`View` that turns one into the other (docs/protocol.md is the wire format).

    Command        a client message as the connection carries it out (start, settings, pause, ...)
    Batch, Notice  what a connection hands its view to render: a generation's rounds, or its own news
    RenderContext  what a view may know of the connection it renders for (run, paused, state, speed)
    View           parse(text, ctx) -> commands and notices; render(items, ctx) -> messages

It imports nothing else of app/: the connection (app/ws/), the views (app/views/) and the watch rooms
(app/watch/) all import it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.serving.settings import excerpt


class CommandError(ValueError):
    """A client message that cannot be carried out; answered with an error, the connection stays open."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


@dataclass
class Command:
    kind: str                   # start | settings | pause | resume | toggle | step | stop | reset | speed | noop | ack
    prompt: str | None = None
    settings: dict = field(default_factory=dict)
    speed: float | None | str = "keep"   # rounds per second, None for full speed, "keep" for no change
    paused: bool = False
    ack: int = 0                # for "ack": how many server messages the page has rendered


@dataclass
class Batch:
    """The events of one or more rounds of one generation, in order."""
    run_id: int | str
    events: list
    link: Any = None            # the SessionLink it came through (its sender counts what it takes)


@dataclass
class Notice:
    """Something the connection (not the engine) has to say: state changes, queued settings, errors."""
    type: str                   # state | queued | settings_queued | error | note | reset | hello | model_options
    data: dict


@dataclass
class RenderContext:
    """What a view knows of the connection (or room, or replay) it renders for."""
    run_id: int | str | None = None     # the current generation: batches of other runs are not drawn
    paused: bool = False
    state: str = "idle"                 # idle | queued | running | paused | stopping | done
    speed: float | None = None
    watch_id: str | None = None         # where watchers follow it (/watch/{watch_id})


class View(Protocol):
    acks: bool                  # the client acknowledges what it has rendered ({"ack": n})
    default_speed: float | None

    def parse(self, text: str, ctx: RenderContext) -> list[Command | Notice]: ...
    def render(self, items: list, ctx: RenderContext) -> list[str]: ...


def json_object(text: str, what: str) -> dict:
    """A client message as a JSON object, or a CommandError saying what was expected (`what`).

    Its text must be Unicode: JSON can spell a lone UTF-16 surrogate (`"\\ud800"`), which no tokenizer
    and no UTF-8 encoder takes, so it is refused here, naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CommandError(f"not valid JSON: {e}") from None
    except ValueError as e:       # e.g. an integer of more than 4,300 digits (Python's conversion limit)
        raise CommandError(f"not valid JSON: {excerpt(str(e), 120)}") from None
    if not isinstance(data, dict):
        raise CommandError(what)
    if _SURROGATE_ESCAPE.search(text):
        name = _lone_surrogate(data)
        if name is not None:
            raise CommandError(f"{name}: not valid text (a lone UTF-16 surrogate such as \\ud800)", name)
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value, name: str = "message") -> str | None:
    """The name of the first field (or key) of `value` whose text holds a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name
    elif isinstance(value, dict):
        for key, item in value.items():
            if _lone_surrogate(key) is not None:
                return "a field name"
            if (found := _lone_surrogate(item, key[:40])) is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            if (found := _lone_surrogate(item, name)) is not None:
                return found
    return None


def parse_speed(value: Any) -> float | None:
    """Rounds per second (0.1 ... 1000), or None for full speed ('max', 0 or empty)."""
    if value is None or value in ("", "max", "full", 0, "0"):
        return None
    try:
        speed = float(value)
    except (TypeError, ValueError):
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {excerpt(value)}", "speed") from None
    if not 0.1 <= speed <= 1000:
        raise CommandError(f"speed: rounds per second (0.1 ... 1000) or 'max', got {excerpt(value)}", "speed")
    return speed
