"""What the servers we start as child processes (llama.cpp's, vLLM's) share: their own output goes to a log file
under our cache folder, never to our terminal, and their errors reach us as an excerpt of that log.

    log = server_log(cache, "llamacpp-plain")     # $DECODING_PLAYGROUND_CACHE/logs/llamacpp-plain.log
    error_excerpt(read_tail(log))                 # its last error lines, one line: what our log says of it
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
from pathlib import Path

# An error line in a server's log: a Python exception (vLLM), llama.cpp's level mark (`0.00.003.123 E srv ...`),
# or the kernel's or the C library's words for a process that died.
ERROR_LINE = re.compile(r"(\w+Error\b|Exception\b|ERROR|Killed|No such file|^[\d.]+ E |\berror:)")


def cache_folder() -> Path:
    """$DECODING_PLAYGROUND_CACHE, else $XDG_CACHE_HOME/decoding-playground, else ~/.cache/decoding-playground
    (engine/model/fetched.py's, which this package may not import)."""
    if os.environ.get("DECODING_PLAYGROUND_CACHE"):
        return Path(os.environ["DECODING_PLAYGROUND_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "decoding-playground"


def server_log(folder: Path, name: str) -> Path:
    """The log file of a server `name` (its latest start's) in `folder`/logs/, the folder made."""
    path = folder / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_tail(path: Path, limit: int = 200_000) -> str:
    """The last `limit` bytes of a log, as text ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def error_excerpt(log: str, limit: int = 1200) -> str:
    """A server's own words for why it stopped: the last error lines of its log (else its last lines)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    wanted = [ln for ln in lines if ERROR_LINE.search(ln) and "Traceback" not in ln and " WARNING " not in ln]
    text = " | ".join(dict.fromkeys(wanted[-4:] or lines[-4:]))
    return text[-limit:] if text else "no output"


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it ends (no orphan after a kill -9)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG
    except OSError:
        pass
