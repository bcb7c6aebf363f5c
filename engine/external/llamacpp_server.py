"""llama.cpp's own C++ server (the optional `xllamacpp` wheel), in a child process of ours, on a loopback port.

    server = EmbeddedLlamaCpp.start(gguf_path, threads=1)   # once it listens; RuntimeError with its log's excerpt
    server.engine                                           # an ExternalEngine for engine/external/openai_stream.py
    server.log_path                                         # everything llama.cpp wrote
    server.close()

llama.cpp writes its log lines (`srv init: ...`, `load_model: ...`) to its process's stderr from its own threads.
In a process of its own (engine/external/llamacpp_process.py) they go to a log file under our cache folder
(logs/llamacpp-*.log, engine/external/child_process.py), and the terminal keeps our lines; its errors reach our
log as an excerpt: when it cannot start (the RuntimeError), and when it exits while it serves (`on_exit`).

It binds 127.0.0.1 on a free port and requires a random API key that only this process and the child know, so
that a web page in the user's browser (llama.cpp's server allows every CORS origin) cannot drive it.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .child_process import cache_folder, error_excerpt, read_tail, server_log
from .llamacpp_process import READY
from .openai_stream import ExternalEngine

logger = logging.getLogger(__name__)

LABEL = "llama.cpp · SmolLM2-135M Q4_1"
NGRAM = (3, 4)          # llama.cpp's n-gram speculation: match the last 3 tokens, draft up to 4
NGRAM_LABEL = f"{LABEL} · n-gram speculation ({NGRAM[0]}-gram, {NGRAM[1]} draft tokens)"
DRAFT_GAMMA = 4         # llama.cpp's draft-model speculation: the shipped draft drafts 4 tokens a step
DRAFT_LABEL = f"{LABEL} · draft model ({DRAFT_GAMMA} draft tokens)"
CHILD = Path(__file__).with_name("llamacpp_process.py")
START_TIMEOUT_S = 120.0     # SmolLM2's GGUF loads in about a second; a loaded machine may take many times that
STOP_GRACE_S = 5.0


OUR_MODEL = "smollm2-135m"                          # our model converted from that GGUF (`fetch-model`)


def gguf_path(cache_dir: str | Path | None = None) -> Path:
    """Where `fetch-model` keeps the SmolLM2 GGUF (engine/model/fetched.py's cache)."""
    return Path(cache_dir or cache_folder()) / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def unavailable_reason(path: Path) -> str | None:
    """Why the embedded server cannot start here (None: it can)."""
    try:
        import xllamacpp  # noqa: F401
    except ImportError as e:
        return f"the llamacpp extra is not installed (pip install -e '.[llamacpp]'): {e}"
    if not path.is_file():
        return f"{path}: no GGUF file (decoding-playground fetch-model smollm2-135m)"
    return None


def draft_gguf(cache_dir: str | Path | None = None) -> Path:
    """Where `fetch-model` writes the GGUF of SmolLM2's shipped draft model (engine/model/gguf_export.py's
    draft_gguf_path, not imported: this room never reaches the numpy model)."""
    return Path(cache_dir or cache_folder()) / "gguf" / f"{OUR_MODEL}-draft.F16.gguf"


def log_name(threads: int, ngram: tuple[int, int] | None, draft: Path | None = None) -> str:
    """'llamacpp-plain-1t', 'llamacpp-ngram-2t', 'llamacpp-draft-1t': one log per kind of server (its latest
    start's)."""
    return f"llamacpp-{'draft' if draft else 'ngram' if ngram else 'plain'}-{threads}t"


@dataclass
class EmbeddedLlamaCpp:
    process: subprocess.Popen = field(repr=False)
    engine: ExternalEngine
    log_path: Path
    closing: bool = False

    @classmethod
    def start(cls, path: Path, threads: int = 1, ctx_size: int = 4096, parallel: int = 2,
              ngram: tuple[int, int] | None = None, cache: Path | None = None,
              timeout_s: float = START_TIMEOUT_S, draft: Path | None = None) -> "EmbeddedLlamaCpp":
        """llama.cpp on `path`; with `ngram` = (n, k) it speculates with its own n-gram lookup (ngram_simple):
        the last n tokens are looked up earlier in the sequence and up to k following tokens drafted; with `draft`
        (a GGUF of the same vocabulary) it speculates with that draft model, DRAFT_GAMMA tokens a step. Returns
        once it listens; raises RuntimeError with the excerpt of its log when it exits first or is not up in time."""
        log_path = server_log(Path(cache or cache_folder()), log_name(threads, ngram, draft))
        key = secrets.token_urlsafe(24)
        settings = {"path": str(path), "threads": threads, "parallel": parallel, "ctx_size": ctx_size,
                    "alias": path.stem, "ngram": list(ngram) if ngram else None,
                    "draft": {"path": str(draft), "gamma": DRAFT_GAMMA} if draft else None}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
               "LANG": os.environ.get("LANG", "C.UTF-8"), "LLAMACPP_API_KEY": key}
        with open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, str(CHILD), json.dumps(settings)], env=env,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        address = wait_listening(process, log_path, timeout_s)
        method, label, speculation = ("draft_model", DRAFT_LABEL, {"speculation": f"draft model {draft.name} (float16), "
                                      f"{DRAFT_GAMMA} draft tokens a step"}) if draft else \
            ("ngram", NGRAM_LABEL, {"speculation": f"n-gram lookup: {ngram[0]}-gram, up to {ngram[1]} draft tokens"}) \
            if ngram else ("none", LABEL, {})
        ours = OUR_MODEL if path.name == gguf_path().name else None      # the weights of which model of ours
        engine = ExternalEngine(label, address + "/v1", None, address + "/metrics", key,
                                "llamacpp", {"threads": threads, "file": path.name, "quantization": "Q4_1",
                                             "bytes": path.stat().st_size, "parallel": parallel, "n_ctx": ctx_size,
                                             "our_model": ours, "speculative_method": method, **speculation})
        server = cls(process, engine, log_path)
        threading.Thread(target=server.on_exit, args=(logger.error,), name="llamacpp-exit", daemon=True).start()
        return server

    def on_exit(self, say: Callable[..., None]) -> None:
        """Waits for the child to end; an end we did not ask for is said, with its log's excerpt."""
        code = self.process.wait()
        if not self.closing:
            say("!!! %s exited with code %s: %s (its log: %s)", self.engine.name, code,
                error_excerpt(read_tail(self.log_path)), self.log_path)

    def close(self) -> None:
        """Stop the child (SIGTERM, SIGKILL after a grace); safe to call twice."""
        self.closing = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_listening(process: subprocess.Popen, log_path: Path, timeout_s: float) -> str:
    """The address the child listens on, from its READY line in its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = read_tail(log_path, 8192)
        at = text.rfind(READY)
        if at >= 0 and "\n" in text[at:]:
            return text[at + len(READY):].split("\n", 1)[0].strip()
        if process.poll() is not None:
            raise RuntimeError(f"llama.cpp exited with code {process.returncode} while starting: "
                               f"{error_excerpt(read_tail(log_path))} (its log: {log_path})")
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"llama.cpp not listening after {timeout_s:g} s: {error_excerpt(read_tail(log_path))} "
                               f"(its log: {log_path})")
        time.sleep(0.05)
