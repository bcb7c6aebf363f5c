"""Who may connect and what every response carries: headers, the Origin check, workshop mode's token, rate limits.

- Security headers on every HTTP response. Embedding works through the CSP `frame-ancestors` directive sent
  as an HTTP header, never through X-Frame-Options (which this app does not send): `/` may be framed by our
  own origin only, `/embed` by the configured frame ancestors (default anyone).
- `check_origin`: a websocket handshake is accepted from the app's own origin and the configured ones only.
- `TokenMiddleware` (workshop mode, `serve --token`): page, API, metrics and websockets need the shared
  secret, as `?token=` in the URL (how a browser passes it: the page puts it into its websocket URL and
  keeps it in its own address, no cookie, so it works inside iframes too) or as `Authorization: Bearer`.
  `/healthz` and the static files stay open.
- `HostMiddleware`: the Host header must be a name this server is reachable by (DNS rebinding).
- `TokenBucket`: the per-connection message rate.
"""
from __future__ import annotations

import hmac
import logging
from urllib.parse import parse_qs

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from app.config import WILDCARD_BINDS, configured_host, host_name, is_ip_literal, normalize_origin

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
def supplied_tokens(scope: Scope) -> list[str]:
    """The tokens a request carries: `?token=` (each of them) and `Authorization: Bearer ...`."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    tokens = list(query.get("token", []))
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                tokens.append(credentials.strip())
    return tokens


def token_matches(supplied: list[str], token: str) -> bool:
    """Either place is enough when one token is right and none is wrong (a wrong one anywhere refuses)."""
    expected = token.encode("utf-8")
    return bool(supplied) and all(hmac.compare_digest(s.encode("utf-8", "surrogatepass"), expected)
                                  for s in supplied)


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
                or token_matches(supplied_tokens(scope), self.token)):
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


# --- the Host header (DNS rebinding) ------------------------------------------------------------------
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")

BAD_HOST_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Decoding Playground: unknown host name</title></head>
<body><h1>400: this server does not answer to that host name</h1>
<p>Open it as localhost, 127.0.0.1 or [::1], or by the name given to <code>serve --host</code>.
A name behind a proxy is added with <code>serve --allowed-host NAME</code>.</p></body></html>
"""


class HostMiddleware:
    """Answers 400 to any request (page, API, websocket handshake) whose Host header is not a name this server
    is reachable by: localhost, 127.0.0.1, [::1], the `serve --host` value and `--allowed-host` names (`*`
    allows any). This is what stops DNS rebinding: a page at evil.example whose name is made to resolve to
    127.0.0.1 is same-origin with itself, so the Origin check passes, but its requests say `Host: evil.example`.
    Bound to every address (0.0.0.0, ::), any IP address is accepted too: rebinding needs a name, and a
    browser sends the name it resolved.
    """

    def __init__(self, app: ASGIApp, allowed_hosts=(), bind_host: str = "127.0.0.1") -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.any_ip = bind_host in WILDCARD_BINDS
        self.allowed = {configured_host(h) for h in (*LOCAL_HOSTS, *allowed_hosts) if h != "*"}
        if not self.any_ip:
            self.allowed.add(configured_host(bind_host))

    def allows(self, host: str | None) -> bool:
        """A well-formed Host value (even with `*`: a malformed one is refused, as RFC 9110 says) naming this server."""
        name = host_name(host)
        if not name:
            return False
        return self.any_host or name in self.allowed or (self.any_ip and is_ip_literal(name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"]
        if len(hosts) == 1 and self.allows(hosts[0]):     # more than one Host header: 400 (RFC 9112 3.2)
            await self.app(scope, receive, send)
            return
        logger.warning("refused %s %s: Host %r is not a name of this server", scope["type"], scope["path"],
                       " | ".join(h[:100] for h in hosts))
        start = {"status": 400, "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                            (b"cache-control", b"no-store")]}
        if scope["type"] == "websocket":      # refused before the handshake: an HTTP 400 (ASGI's response extension)
            await send({"type": "websocket.http.response.start", **start})
            await send({"type": "websocket.http.response.body", "body": BAD_HOST_PAGE})
            return
        await send({"type": "http.response.start", **start})
        await send({"type": "http.response.body", "body": BAD_HOST_PAGE})


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
