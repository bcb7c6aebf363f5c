"""The child process engine/external/llamacpp_server.py starts: llama.cpp's C++ server (the `xllamacpp` wheel) on
the settings in its one argument (JSON), its API key in $LLAMACPP_API_KEY, until SIGTERM or until the process
that started it is gone.

It is run by its path (`python llamacpp_process.py SETTINGS`), so it imports neither our engine nor numpy. Its
stdout and stderr are the log file its parent opened: llama.cpp's own lines go there. Once llama.cpp listens, it
writes one line of its own to that log, READY followed by the address, which its parent waits for.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

READY = "decoding-playground: llama.cpp listening on "
PARENT_CHECK_S = 1.0          # how often it looks whether the process that started it is still there


def params(xl, c: dict):
    """llama.cpp's parameters: `c` holds the GGUF's path, the threads, the context, the requests served at once,
    the name /v1/models gives it and, for its n-gram speculation (ngram_simple), (n, k): the last n tokens are
    looked up earlier in the sequence and up to k following tokens drafted; for its draft-model speculation
    (draft_simple), the draft's GGUF and γ: every step drafts γ tokens, greedily (p_min 0: no early stop)."""
    p = xl.CommonParams()
    p.model.path = c["path"]
    p.cpuparams.n_threads = c["threads"]
    p.cpuparams_batch.n_threads = c["threads"]
    p.n_parallel = c["parallel"]             # requests served at once (each gets ctx_size / parallel)
    p.n_ctx = c["ctx_size"]
    p.hostnames = ["127.0.0.1"]
    p.port = 0                               # a free port, chosen by the OS
    p.endpoint_metrics = True
    p.api_keys = [os.environ["LLAMACPP_API_KEY"]]
    p.ui = False
    p.model_alias = {c["alias"]}             # what /v1/models names (not the cache's full path)
    if c.get("ngram"):
        p.speculative.types = [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        p.speculative.ngram_simple.size_n, p.speculative.ngram_simple.size_m = c["ngram"]
    if c.get("draft"):
        p.speculative.types = [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        d = p.speculative.draft
        d.mparams.path = c["draft"]["path"]
        d.n_max, d.n_min, d.p_min = c["draft"]["gamma"], 0, 0.0
        d.cpuparams.n_threads = d.cpuparams_batch.n_threads = c["threads"]
    return p


def main(argv: list[str]) -> int:
    import xllamacpp as xl

    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = xl.Server(params(xl, json.loads(argv[1])))
    address = server.listening_address       # http://127.0.0.1:PORT
    if not address.startswith("http://127.0.0.1:"):
        print(f"error: llama.cpp listens on {address!r}, not on loopback", file=sys.stderr, flush=True)
        return 1
    print(READY + address, flush=True)
    while not stop.wait(PARENT_CHECK_S) and os.getppid() == parent:
        pass
    del server                               # its destructor stops the server's threads
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
