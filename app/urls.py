"""Links the server writes into pages: in workshop mode they carry the token (app/security.py)."""
from __future__ import annotations

from urllib.parse import urlencode


def with_token(path: str, playground, **params) -> str:
    """`path` with `params` and, in workshop mode, `token` as its query string."""
    if playground.config.token:
        params["token"] = playground.config.token
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{path}?{query}" if query else path
