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

from engine.serving.settings import excerpt, excerpt_name


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
    huge = _HUGE_INTEGER.search(text) is not None
    try:
        data = json.loads(text, parse_int=_parse_int) if huge else json.loads(text)
    except json.JSONDecodeError as e:
        raise CommandError(f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CommandError(what)
    if huge and (found := _first(data, lambda v: isinstance(v, HugeInteger))) is not None:
        name, value = found
        raise CommandError(f"{name}: an integer of {value.digits:,} digits; at most {MAX_INTEGER_DIGITS:,} are read",
                           name)
    if _SURROGATE_ESCAPE.search(text):
        found = _first(data, _lone_surrogate, key=_lone_surrogate)
        if found is not None:
            name = found[0]
            raise CommandError(f"{name}: not valid text (a lone UTF-16 surrogate such as \\ud800)", name)
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_INTEGER_DIGITS = 4300            # Python's limit for converting text to int (sys.get_int_max_str_digits)
_HUGE_INTEGER = re.compile(r"\d{%d}" % (MAX_INTEGER_DIGITS + 1))


class HugeInteger:
    """An integer literal longer than Python converts: kept as its length, so that the error can name its field."""

    def __init__(self, digits: int):
        self.digits = digits


def _parse_int(text: str):
    digits = len(text.lstrip("-"))
    return HugeInteger(digits) if digits > MAX_INTEGER_DIGITS else int(text)


def _lone_surrogate(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _first(value, bad, name: str = "message", key=lambda k: False) -> tuple[str, object] | None:
    """The first field of `value` (depth first) whose value is `bad`: (its name, the value), or None. A bad
    key (`key`) is reported as "a field name"."""
    if bad(value):
        return name, value
    if isinstance(value, dict):
        for k, item in value.items():
            if key(k):
                return "a field name", k
            if (found := _first(item, bad, excerpt_name(k), key)) is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            if (found := _first(item, bad, name, key)) is not None:
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
