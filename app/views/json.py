"""`/api/ws`: client messages as JSON objects with a `type`, engine events out as JSON objects.

The vocabulary is documented in docs/protocol.md. Engine events are sent as `event.to_dict()` gives
them (one message each), `done` additionally carries the summary's fields at its top level (the
fields of `generate --json`); the connection adds `state`, `settings_queued` and `error`.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app.protocol import Batch, Command, CommandError, Notice, RenderContext, json_object, parse_speed
from engine.serving.settings import excerpt, excerpt_name


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartMessage(_Message):
    type: Literal["start"]
    prompt: str
    settings: dict[str, Any] = Field(default_factory=dict)
    speed: float | str | None = "max"
    paused: bool = False


class SettingsMessage(_Message):
    type: Literal["settings"]
    settings: dict[str, Any]


class SpeedMessage(_Message):
    type: Literal["speed"]
    speed: float | str | None


class ControlMessage(_Message):
    type: Literal["pause", "resume", "step", "stop", "reset"]


ClientMessage = TypeAdapter(Annotated[Union[StartMessage, SettingsMessage, SpeedMessage, ControlMessage],
                                      Field(discriminator="type")])
MESSAGE_TYPES = ("start", "settings", "pause", "resume", "step", "stop", "reset", "speed")


def _validation_message(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(excerpt_name(str(x)) for x in err["loc"] if not str(x).endswith("Message"))
    if err["type"] == "union_tag_invalid":
        got = err.get("input", {}).get("type")
        return f"type: unknown message type {excerpt(got)}; expected one of {', '.join(MESSAGE_TYPES)}"
    if err["type"] == "union_tag_not_found":
        return f"type: every message needs a 'type', one of {', '.join(MESSAGE_TYPES)}"
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field"
    return f"{loc}: {err['msg']}"


def _plain(value):
    """json.dumps fallback for numpy scalars and other number-likes."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: dict) -> str:
    """Compact JSON text. orjson encodes a message in a fraction of `json.dumps`'s time, and it matters: with
    many sessions the event loop encodes about two messages per output token, holding the GIL the engine
    thread needs meanwhile.
    Its output is the same JSON (shortest round-trip floats, compact separators) except that NaN and
    infinities become null (json.dumps writes NaN, which is not JSON); what orjson refuses (an int beyond
    64 bits, an unknown type) goes through json.dumps."""
    try:
        return orjson.dumps(obj, default=_plain, option=_ORJSON_OPTIONS).decode()
    except TypeError:
        return json.dumps(obj, default=_plain, separators=(",", ":"))


def event_dict(event) -> dict:
    """`event.to_dict()` without its deep copy (dataclasses.asdict copies every nested value, most of a message's
    cost): the fields are plain values, lists and dicts, serialised at once and never changed here."""
    return {"type": event.type, **vars(event)}


class JsonView:
    default_speed = None      # programs want full speed unless they ask for pacing
    acks = False

    def parse(self, text: str, ctx: RenderContext) -> list[Command]:
        data = json_object(text, "a message is a JSON object with a 'type'")
        try:
            msg = ClientMessage.validate_python(data)
        except ValidationError as e:
            raise CommandError(_validation_message(e)) from None
        if isinstance(msg, StartMessage):
            return [Command("start", prompt=msg.prompt, settings=msg.settings, speed=parse_speed(msg.speed),
                            paused=msg.paused)]
        if isinstance(msg, SettingsMessage):
            return [Command("settings", settings=msg.settings)]
        if isinstance(msg, SpeedMessage):
            return [Command("speed", speed=parse_speed(msg.speed))]
        return [Command(msg.type)]

    def render(self, items: list, ctx: RenderContext) -> list[str]:
        out = []
        current = ctx.run_id
        for item in items:
            if isinstance(item, Notice):
                out.append(dumps({"type": item.type, **item.data}))
            elif isinstance(item, Batch) and item.run_id == current:
                for event in item.events:
                    d = event_dict(event)
                    if d["type"] == "started" and ctx.watch_id:
                        d["watch_id"] = ctx.watch_id     # /watch/{watch_id} and /api/watch/{watch_id} follow it
                    elif d["type"] == "done":
                        d = {"type": "done", **d["summary"], "summary": d["summary"]}
                    out.append(dumps(d))
        return out
