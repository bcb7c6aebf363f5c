"""llama.cpp's own C++ server, in this process (the optional `xllamacpp` wheel), on a loopback port.

    server = EmbeddedLlamaCpp.start(gguf_path, threads=1)    # None-safe: see `available()`
    server.engine                                           # an ExternalEngine for engine/external/openai_stream.py
    server.close()

It binds 127.0.0.1 on a free port and requires a random API key that only this process knows, so that a
web page in the user's browser (llama.cpp's server allows every CORS origin) cannot drive it.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from .openai_stream import ExternalEngine

LABEL = "llama.cpp · SmolLM2-135M Q4_1"
NGRAM = (3, 4)          # llama.cpp's n-gram speculation: match the last 3 tokens, draft up to 4
NGRAM_LABEL = f"{LABEL} · n-gram speculation ({NGRAM[0]}-gram, {NGRAM[1]} draft tokens)"


def gguf_path(cache_dir: str | Path | None = None) -> Path:
    """Where `fetch-model` keeps the SmolLM2 GGUF (engine/model/fetched.py's cache)."""
    cache = Path(cache_dir or os.environ.get("DECODING_PLAYGROUND_CACHE")
                 or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "decoding-playground")
    return cache / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def unavailable_reason(path: Path) -> str | None:
    """Why the embedded server cannot start here (None: it can)."""
    try:
        import xllamacpp  # noqa: F401
    except ImportError as e:
        return f"the llamacpp extra is not installed (pip install -e '.[llamacpp]'): {e}"
    if not path.is_file():
        return f"{path}: no GGUF file (decoding-playground fetch-model smollm2-135m)"
    return None


@dataclass
class EmbeddedLlamaCpp:
    server: object
    engine: ExternalEngine

    @classmethod
    def start(cls, path: Path, threads: int = 1, ctx_size: int = 4096, parallel: int = 2,
              ngram: tuple[int, int] | None = None) -> "EmbeddedLlamaCpp":
        """llama.cpp on `path`; with `ngram` = (n, k) it speculates with its own n-gram lookup (ngram_simple):
        the last n tokens are looked up earlier in the sequence and up to k following tokens drafted."""
        import xllamacpp as xl

        p = xl.CommonParams()
        p.model.path = str(path)
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.n_parallel = parallel                  # requests served at once (each gets ctx_size / parallel)
        p.n_ctx = ctx_size
        p.hostnames = ["127.0.0.1"]
        p.port = 0                               # a free port, chosen by the OS
        p.endpoint_metrics = True
        key = secrets.token_urlsafe(24)
        p.api_keys = [key]
        p.ui = False
        p.model_alias = {path.stem}              # what /v1/models names (not the cache's full path)
        speculation = {}
        if ngram is not None:
            p.speculative.types = [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
            p.speculative.ngram_simple.size_n, p.speculative.ngram_simple.size_m = ngram
            speculation = {"speculation": f"n-gram lookup: {ngram[0]}-gram, up to {ngram[1]} draft tokens"}
        server = xl.Server(p)
        address = server.listening_address       # http://127.0.0.1:PORT
        if not address.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"llama.cpp listens on {address!r}, not on loopback")
        engine = ExternalEngine(LABEL if ngram is None else NGRAM_LABEL, address + "/v1", None, address + "/metrics", key, "llamacpp",
                                {"threads": threads, "file": path.name, "quantization": "Q4_1",
                                 "bytes": path.stat().st_size, "parallel": parallel, "n_ctx": ctx_size,
                                 **speculation})
        return cls(server, engine)

    def close(self) -> None:
        self.server = None                       # its destructor stops the server's threads
