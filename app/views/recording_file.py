"""Reading a recording file (app/views/recording.py's `to_json`, as the page exports it): a value at a time, and
each event field by field as it is read.

An upload is read in a process of its own (app/routers/teach/replay.py), a value at a time (each event, each
other field) with `json.JSONDecoder.raw_decode` over at most MAX_VALUE_CHARS characters: no value of a file may be
longer, and one bad value is named where it is.

The server then makes the recording again from that process's parts (`rebuilt_recording`) with the cycle
collector held off: the recording's own objects (a 16 MB file makes about 260,000 lists, dicts and events) would
trigger its full collections, each of which walks every object of the process while it holds the GIL that the
event loop and the engine need. Once made, its objects leave the collector's sight (`gc.freeze`, as start-up's
objects do in app/state.py). They are still freed by reference counting when the store lets the recording go: an
event is plain values, lists and dicts, with no cycle among them.

Each event is checked against its type in engine/serving/events.py before it is made: a field missing, unknown
or of the wrong kind is an error naming the event's index, its type and the field (`event 17 (token): p must be
a number or null, not a string`), so that nothing of a file reaches the views unchecked but the contents of
the objects and lists inside an event.
"""
from __future__ import annotations

import codecs
import dataclasses
import gc
import hashlib
import json
import pickle
import re
import threading
import time
import types
import typing
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from engine.serving.events import EVENT_TYPES, Event, event_from_dict
from engine.serving.settings import excerpt

FORMAT = "decoding-playground/recording"
VERSION = 1
MAX_EVENTS = 40_000              # a 4,096-token run is about 17,000 events
MAX_VALUE_CHARS = 1 << 20        # one event or one other field (a 4,096-token run's summary is about 200 KB)
FIRST_PIECE_CHARS = 4096         # most events are a few hundred characters
PART_PAUSE_S = 0.001            # rebuilt_recording's sleep between two parts
TEXT_PIECE_BYTES = 1 << 20       # the file is decoded from UTF-8 this much at a time, for the same reason
_SPACE = re.compile(r"[ \t\n\r]*")


class RecordingError(ValueError):
    """A file that is not a recording this version can replay."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


class JsonPieces:
    """A JSON text read one value at a time; each decode reads at most MAX_VALUE_CHARS characters."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        self.pos = _SPACE.match(self.text, self.pos).end()
        return self.text[self.pos:self.pos + 1]

    def _expect(self, char: str, what: str) -> None:
        if self.peek() != char:
            raise RecordingError(f"{what}: expected {char!r} at character {self.pos:,}")
        self.pos += 1

    def value(self, what: str):
        """The next value, decoded from a piece of the text that grows (x4) until the value fits in it."""
        self.peek()
        size = FIRST_PIECE_CHARS
        while True:
            piece = self.text[self.pos:self.pos + size]
            cut = self.pos + size < len(self.text)
            try:
                value, end = _DECODER.raw_decode(piece)
                if not (cut and end == len(piece)):        # (a number may go on after the piece)
                    self.pos += end
                    return value
            except json.JSONDecodeError as e:
                # the errors of a piece cut inside its value: at its very end, or a string that does not end
                if not cut or not (e.pos >= len(piece) - 6 or e.msg.startswith("Unterminated string")):
                    raise RecordingError(f"{what}: {e.msg} at character {self.pos + e.pos:,}") from None
            except ValueError as e:                         # NaN, Infinity, an integer of over 4,300 digits
                raise RecordingError(f"{what}: {e}") from None
            if size >= MAX_VALUE_CHARS:
                raise RecordingError(f"{what}: longer than {MAX_VALUE_CHARS:,} characters")
            size *= 4

    def members(self, what: str) -> Iterator[str]:
        """An object's member names; the caller reads each one's value (`value`, or `items` for an array)."""
        self._expect("{", what)
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            name = self.value(f"{what}: a member's name")
            if not isinstance(name, str):
                raise RecordingError(f"{what}: a member's name must be a string, at character {self.pos:,}")
            self._expect(":", what)
            yield name
            self._close("}", what)
            if self.text[self.pos - 1] == "}":
                return

    def items(self, what: str) -> Iterator[int]:
        """An array's indices; the caller reads each item."""
        self._expect("[", what)
        if self.peek() == "]":
            self.pos += 1
            return
        i = 0
        while True:
            yield i
            self._close("]", what)
            if self.text[self.pos - 1] == "]":
                return
            i += 1

    def _close(self, end: str, what: str) -> None:
        char = self.peek()
        if char not in (",", end):
            raise RecordingError(f"{what}: expected ',' or {end!r} at character {self.pos:,}")
        self.pos += 1

    def end(self) -> None:
        if self.peek():
            raise RecordingError(f"more after the recording's end, at character {self.pos:,}")


# --- what each field may hold ------------------------------------------------------------------------------
_KINDS = {int: ((int,), "an integer"), float: ((int, float), "a number"), str: ((str,), "a string"),
          bool: ((bool,), "true or false"), dict: ((dict,), "an object"), list: ((list,), "a list")}


class Kind(typing.NamedTuple):
    """The JSON values a field of an event may hold, from its type hint (`float | None`, `list[dict]`)."""
    types: tuple
    nullable: bool
    element: type | None            # of a list
    text: str

    @classmethod
    def of(cls, hint) -> "Kind":
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        (base,) = [a for a in args if a is not type(None)]
        origin, element = typing.get_origin(base) or base, (typing.get_args(base) or (None,))[0]
        allowed, text = _KINDS[origin]
        if element is not None:
            text = f"a list of {_KINDS[element][1].removeprefix('an ').removeprefix('a ')}s"
        nullable = type(None) in args
        return cls(allowed, nullable, element, text + (" or null" if nullable else ""))

    def holds(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) and bool not in self.types:
            return False
        if not isinstance(value, self.types):
            return False
        return self.element is None or all(isinstance(x, self.element) for x in value)


def _json_kind(value) -> str:
    for allowed, text in ((type(None), "null"), (bool, "true or false"), ((int, float), "a number"),
                          (str, "a string"), (dict, "an object"), (list, "a list")):
        if isinstance(value, allowed):
            return text.replace("true or false", "a boolean")
    return type(value).__name__


def _fields(cls) -> dict[str, tuple[Kind, bool]]:
    """Each field's kind and whether it is required (has no default)."""
    hints, missing = typing.get_type_hints(cls), dataclasses.MISSING
    return {f.name: (Kind.of(hints[f.name]), f.default is missing and f.default_factory is missing)
            for f in dataclasses.fields(cls)}


EVENT_FIELDS = {name: _fields(cls) for name, cls in EVENT_TYPES.items()}


def check_event(i: int, d) -> Event:
    """Event `i` of a file, checked field by field (RecordingError naming it and the field)."""
    if not isinstance(d, dict):
        raise RecordingError(f"event {i}: an object with a type, not {_json_kind(d)}")
    fields = EVENT_FIELDS.get(d.get("type")) if isinstance(d.get("type"), str) else None
    if fields is None:
        raise RecordingError(f"event {i}: type {excerpt(d.get('type'))} is not one of {', '.join(EVENT_FIELDS)}")
    where = f"event {i} ({d['type']})"
    for name in d:
        if name != "type" and name not in fields:
            raise RecordingError(f"{where}: unknown field {excerpt(name)}")
    for name, (kind, required) in fields.items():
        if name not in d:
            if required:
                raise RecordingError(f"{where}: {name} is missing")
        elif not kind.holds(d[name]):
            raise RecordingError(f"{where}: {name} must be {kind.text}, not {_json_kind(d[name])}")
    return event_from_dict(d)


TOP_FIELDS = {"created": Kind((int, float), True, None, "a number or null"),
              "prompt": Kind((str,), True, None, "a string or null"),
              "settings": Kind((dict,), False, None, "an object"),
              "complete": Kind((bool,), False, None, "true or false"),
              "truncated": Kind((bool,), False, None, "true or false")}


def _check_header(top: dict) -> None:
    if top.get("format") != FORMAT:
        raise RecordingError(f"not a recording of this playground (expected \"format\": \"{FORMAT}\")")
    if top.get("version") != VERSION:
        raise RecordingError(f"recording version {excerpt(top.get('version'))}; this page replays version {VERSION}")


def _pieces(body: bytes | Iterable[bytes]) -> Iterator:
    """The file a piece at a time: as given, or cut into TEXT_PIECE_BYTES."""
    if not isinstance(body, (bytes, bytearray)):
        yield from body
        return
    view = memoryview(body)
    for start in range(0, len(view), TEXT_PIECE_BYTES):
        yield view[start:start + TEXT_PIECE_BYTES]


def _text_and_key(body: bytes | Iterable[bytes]) -> tuple[str, str]:
    """The file's text (UTF-8, a byte-order mark allowed) and a hash of its bytes, a piece at a time."""
    decoder, digest, parts, offset = codecs.getincrementaldecoder("utf-8-sig")(), hashlib.sha256(), [], 0
    try:
        for piece in _pieces(body):
            digest.update(piece)                       # (hashlib lets the GIL go over large pieces)
            parts.append(decoder.decode(piece))
            offset += len(piece)
        parts.append(decoder.decode(b"", final=True))
    except UnicodeDecodeError as e:
        raise RecordingError(f"not UTF-8 text ({e.reason} near byte {offset + e.start:,})") from None
    return "".join(parts), digest.hexdigest()[:32]


_collector = {"lock": threading.Lock(), "readers": 0, "was_enabled": True}


@contextmanager
def _collector_held_off():
    """No automatic cycle collection while any file is being read (see the module's docstring)."""
    with _collector["lock"]:
        _collector["readers"] += 1
        if _collector["readers"] == 1:
            _collector["was_enabled"] = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _collector["lock"]:
            _collector["readers"] -= 1
            if _collector["readers"] == 0 and _collector["was_enabled"]:
                gc.enable()


def read_recording(recording_class, body: bytes | Iterable[bytes], name: str | None = None):
    """A recording file's bytes (whole, or piece by piece) as a `recording_class` (app/views/recording.py's
    Recording, which calls this), or RecordingError: what is wrong, and where. Its key is a hash of the bytes:
    the same file, the same key."""
    with _collector_held_off():
        rec = _read(recording_class, body, name)
        gc.freeze()                     # (only a file read whole: a refused one's objects go by reference counting)
    return rec


def rebuilt_recording(parts: Iterable[bytes]):
    """A recording as the process that read its file sent it (Recording.to_parts), made again a part at a time:
    each part is one `pickle.loads` of a few events, a call that holds the GIL, and after each the thread sleeps a
    moment: the engine's thread, which wants the GIL back after every product it hands to BLAS, would otherwise
    wait for a part at each of them. Like a file read, its objects are made with the collector held off, then
    leave its sight."""
    parts = iter(parts)
    with _collector_held_off():
        rec = pickle.loads(next(parts))
        for part in parts:
            for event in pickle.loads(part):
                rec.add(event)
            time.sleep(PART_PAUSE_S)
        gc.freeze()
    return rec


def _read(recording_class, body: bytes | Iterable[bytes], name: str | None):
    text, key = _text_and_key(body)
    reader, top = JsonPieces(text), {}
    if reader.peek() != "{":
        raise RecordingError(f"not a recording of this playground (an object with \"format\": \"{FORMAT}\")")
    rec, snapshots = None, {}
    for member in reader.members("the file"):
        if member == "events":
            if "format" in top:
                _check_header(top)
            rec = recording_class(key, source="file", name=name)
            for i in reader.items("events"):
                if i >= MAX_EVENTS:
                    raise RecordingError(f"more than {MAX_EVENTS:,} events")
                event = check_event(i, reader.value(f"event {i}"))
                if i == 0 and event.type != "started":
                    raise RecordingError("the first event must be 'started'")
                rec.add(event)
        elif member == "kv_after":
            for j in reader.items("kv_after"):
                item = reader.value(f"kv_after {j}")
                pool_key = item.get("key") if isinstance(item, dict) else None
                if not (isinstance(pool_key, list) and isinstance(item.get("pool"), dict)
                        and all(isinstance(x, (str, int, float)) for x in pool_key)):
                    raise RecordingError(f"kv_after {j}: an object with a key (a list of names and numbers) and a pool "
                                         "(an object)")
                snapshots[tuple(pool_key)] = item["pool"]
        else:
            top[member] = value = reader.value(member)
            kind = TOP_FIELDS.get(member)
            if kind is not None and not kind.holds(value):
                raise RecordingError(f"{member} must be {kind.text}, not {_json_kind(value)}")
    reader.end()
    _check_header(top)
    if rec is None or not rec.events:
        raise RecordingError("the recording has no events")
    rec.prompt, rec.snapshots, rec.truncated = top.get("prompt"), snapshots, bool(top.get("truncated"))
    if top.get("created") is not None:
        rec.created = top["created"]
    return rec
