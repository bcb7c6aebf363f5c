"""Structured logs: one line per event, `key=value` pairs (or JSON objects), never a prompt or a token.

    log_event(logger, "generation_started", session=..., model=..., method=...)

`serve` installs `configure(fmt)` for the app's and uvicorn's loggers. NOTE (privacy): our own events carry
settings, counts and timings only; uvicorn's access and websocket lines carry the request path, whose
query string (a page URL holds the prompt, and in workshop mode the token) is cut off by `RedactQuery`.
"""
from __future__ import annotations

import json
import logging
import logging.config
import re
import time

_QUERY = re.compile(r"\?[^\s\"]*")


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"fields": fields})


class RedactQuery(logging.Filter):
    """Cuts query strings out of log lines (uvicorn logs `GET /?prompt=...&token=...`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(_QUERY.sub("?…", a) if isinstance(a, str) and "?" in a else a for a in args)
        elif isinstance(record.msg, str) and "?" in record.msg:
            record.msg = _QUERY.sub("?…", record.msg)
        return True


class StructuredFormatter(logging.Formatter):
    """`ts=... level=info logger=app.ws.connection event=generation_started session=... model=...` or JSON."""

    def __init__(self, fmt: str = "text"):
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name}
        if fields is not None:
            out["event"] = record.msg
            out.update(fields)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if self.json:
            return json.dumps(out, default=str)
        return " ".join(f"{k}={_logfmt(v)}" for k, v in out.items())


def _logfmt(value) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text, ensure_ascii=False)
    return text


def configure(fmt: str = "text", level: str = "info") -> dict:
    """Logging for `serve`: the app's loggers and uvicorn's through one structured handler; returns the
    dictConfig (also handed to uvicorn as its `log_config`)."""
    config = {
        "version": 1, "disable_existing_loggers": False,
        "filters": {"redact": {"()": RedactQuery}},
        "formatters": {"structured": {"()": StructuredFormatter, "fmt": fmt}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "structured",
                                "filters": ["redact"], "stream": "ext://sys.stderr"}},
        "loggers": {name: {"handlers": ["stderr"], "level": level.upper(), "propagate": False}
                    for name in ("app", "engine", "cli", "uvicorn", "uvicorn.error", "uvicorn.access")},
    }
    logging.config.dictConfig(config)
    return config
