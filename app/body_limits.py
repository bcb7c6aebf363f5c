"""Every HTTP request body is bounded before it is read: a limit per route, checked as the body arrives.

- A `Content-Length` over the route's limit is answered 413 at once: nothing of the body is read.
- A body without one (`Transfer-Encoding: chunked`) is counted as it arrives. The message that would take it
  over the limit is never handed to the route: the route is stopped there and the client gets 413.
- The 413 closes the connection (`Connection: close`). Kept open, uvicorn would go on reading the rest of the
  body, however long, only to discard it before a next request.

So no route reads more than its limit, and the server holds at most uvicorn's read buffer beyond it (it stops
reading a socket once 64 KiB wait unread). A route reads its body only when it asks (`request.body()`), so
pure ASGI is the place for this: a Starlette middleware would see the request after the body is in.

`BODY_LIMITS` is the table docs/protocol.md shows; a request to any other route may carry `OTHER_BYTES`
(no GET reads a body; the forms' own limit is the same).
"""
from __future__ import annotations

import json
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
RECORDING_BYTES = 32 * MiB           # a recording file: a 4,096-token run's export is about 9 MB
FORM_BYTES = 64 * KiB                # a teaching view's form, as htmx sends it (url-encoded)
OTHER_BYTES = 64 * KiB

BODY_LIMITS: dict[tuple[str, str], int] = {
    ("POST", "/teach/replays"): RECORDING_BYTES,
    ("POST", "/teach/race"): FORM_BYTES,
    ("POST", "/teach/shootout"): FORM_BYTES,
    ("POST", "/teach/faults"): FORM_BYTES,
    ("POST", "/teach/distribution"): FORM_BYTES,
}


def human_bytes(n: int) -> str:
    """32 MiB, 64 KiB, 100 bytes."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def limit_for(method: str, path: str) -> int:
    return BODY_LIMITS.get((method, path), OTHER_BYTES)


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (None: none, e.g. a chunked body; uvicorn refuses malformed ones itself)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyTooLarge(Exception):
    """Raised into the route by its `receive` when the body goes over the route's limit."""


class BodyLimitMiddleware:
    """The route's limit (`limit_for`) on every HTTP request body; 413 naming it, then the connection closed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope["method"], scope["path"])
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self.refuse(scope, send, limit, f"Content-Length {declared:,}")
            return
        received = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge()
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, watched_send)
        except BodyTooLarge:
            if started:           # the route answered before reading its whole body, then read on: nothing to add
                raise
            await self.refuse(scope, send, limit, f"more than {received:,} bytes so far")

    @staticmethod
    async def refuse(scope: Scope, send: Send, limit: int, what: str) -> None:
        route = f"{scope['method']} {scope['path']}"
        logger.warning("refused %s: body over its limit of %s (%s)", route, human_bytes(limit), what)
        body = json.dumps({"error": f"request body too large: {route} takes at most {human_bytes(limit)}"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})
