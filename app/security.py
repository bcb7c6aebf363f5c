"""Who may connect and what every response carries: headers, the Origin check, workshop mode's token, rate limits.

- Security headers on every HTTP response. Embedding works through the CSP `frame-ancestors` directive sent
  as an HTTP header, never through X-Frame-Options (which this app does not send): `/` may be framed by our
  own origin only, `/embed` by the configured frame ancestors (default anyone).
- `check_origin`: a websocket handshake is accepted from the app's own origin and the configured ones only.
- `TokenMiddleware` (workshop mode, `serve --token`): page, API, metrics and websockets need the shared
  secret, as `?token=` in the URL (how a browser passes it: the page puts it into its websocket URL and
  keeps it in its own address, no cookie, so it works inside iframes too) or as `Authorization: Bearer`.
  `/healthz` and the static files stay open.
- `TokenBucket`: the per-connection message rate.
"""
from __future__ import annotations

import hmac
import logging
from urllib.parse import parse_qs

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from app.config import normalize_origin

logger = logging.getLogger(__name__)

FRAME_ANCESTORS_SELF = "'self'"
FRAME_ANCESTORS_ANY = "*"
OPEN_PATHS = ("/healthz", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)


def content_security_policy(frame_ancestors: str = FRAME_ANCESTORS_SELF) -> str:
    """Same-origin scripts, styles, images and connections (websockets included); no plugins, no CDN."""
    return (
        "default-src 'self'; base-uri 'self'; form-action 'self'; object-src 'none'; "
        f"frame-ancestors {frame_ancestors}"
    )


class SecurityHeadersMiddleware:
    """Adds `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` (a workshop token in the page's
    address must not leak to other sites) and, unless the route set its own, the default CSP."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
                headers.setdefault("Content-Security-Policy", content_security_policy())
            await send(message)

        await self.app(scope, receive, send_with_headers)


# --- the Origin of websocket handshakes ---------------------------------------------------------------
def own_origin(websocket: WebSocket) -> str | None:
    """The origin this app is served from, as the client addressed it (scheme and Host header)."""
    host = websocket.headers.get("host")
    if not host:
        return None
    scheme = "https" if websocket.url.scheme in ("wss", "https") else "http"
    try:
        return normalize_origin(f"{scheme}://{host}")
    except ValueError:
        return None


def origin_allowed(websocket: WebSocket, allowed_origins) -> bool:
    """The app's own origin and the configured ones, compared exactly (after normalisation).

    A client that sends no Origin at all is not a browser (browsers always send one with a websocket
    handshake), so no other site's page can be behind it: it is accepted. `null` (sandboxed frames,
    file://) and garbage are refused.
    """
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    try:
        origin = normalize_origin(origin)
    except ValueError:
        return False
    allowed = set(allowed_origins)
    own = own_origin(websocket)
    if own:
        allowed.add(own)
    return origin in allowed


# --- workshop mode ------------------------------------------------------------------------------------
def supplied_token(scope: Scope) -> str | None:
    """The token a request carries: `?token=` or `Authorization: Bearer ...`."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][-1]
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return credentials.strip()
    return None


def token_matches(supplied: str | None, token: str) -> bool:
    return supplied is not None and hmac.compare_digest(supplied.encode("utf-8", "surrogatepass"),
                                                        token.encode("utf-8"))


UNAUTHORIZED_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Decoding Playground: token needed</title></head>
<body><h1>This playground is in workshop mode</h1>
<p>Open it with the link you were given: it ends in <code>?token=...</code>.
Programs can send the token as <code>Authorization: Bearer ...</code>.</p></body></html>
"""


class TokenMiddleware:
    """Workshop mode: every request but `/healthz` and static files needs the token (401, or 403 for a
    websocket handshake, which is refused before it is accepted)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.token is None or scope["type"] not in ("http", "websocket")
                or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES)
                or token_matches(supplied_token(scope), self.token)):
            await self.app(scope, receive, send)
            return
        logger.warning("refused %s %s: workshop token missing or wrong", scope["type"], scope["path"])
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "token required"})
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"text/html; charset=utf-8"), (b"www-authenticate", b'Bearer realm="playground"'),
            (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_PAGE})


# --- message rate -----------------------------------------------------------------------------------
class TokenBucket:
    """`rate` messages a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.level = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= 1.0:
            self.level -= 1.0
            return True
        return False
