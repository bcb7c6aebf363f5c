"""Security headers for every HTTP response.

NOTE: embedding works through the CSP `frame-ancestors` directive sent as an HTTP header, never through
X-Frame-Options (which this app does not send): `/` may be framed by our own origin only, `/embed` by anyone.
"""

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FRAME_ANCESTORS_SELF = "'self'"
FRAME_ANCESTORS_ANY = "*"


def content_security_policy(frame_ancestors: str = FRAME_ANCESTORS_SELF) -> str:
    """Same-origin scripts, styles, images and connections (websockets included); no plugins, no CDN."""
    return (
        "default-src 'self'; base-uri 'self'; form-action 'self'; object-src 'none'; "
        f"frame-ancestors {frame_ancestors}"
    )


class SecurityHeadersMiddleware:
    """Adds `X-Content-Type-Options: nosniff` and, unless the route set its own, the default CSP."""

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
                headers.setdefault("Content-Security-Policy", content_security_policy())
            await send(message)

        await self.app(scope, receive, send_with_headers)
