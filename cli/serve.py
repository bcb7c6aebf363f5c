"""`decoding-playground serve`: the playground page, its websockets and API on one uvicorn process.

Every bad option (and every bad DECODING_PLAYGROUND_* variable) ends in one line, `decoding-playground serve:
error: ...`, and exit status 2, before anything is loaded or bound: a number out of range, an origin or host
name that is not one, a models folder without models, an engine URL that is not http(s).
"""
from __future__ import annotations

import argparse
import math
import socket
from pathlib import Path


class _OpenAIEngine(argparse.Action):
    """--openai-url starts an engine; --openai-model and --openai-metrics-url describe the latest one."""

    def __call__(self, parser, namespace, value, option_string=None):
        engines = list(getattr(namespace, self.dest) or [])
        if option_string == "--openai-url":
            engines.append({"url": value})
        elif not engines:
            parser.error(f"{option_string} needs an --openai-url before it")
        else:
            key = "model" if option_string == "--openai-model" else "metrics_url"
            engines[-1] = {**engines[-1], key: value}
        setattr(namespace, self.dest, engines)


def _integer(low: int, high: int | None = None, what: str = ""):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number{what}, got {text[:40]!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"{low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{bound}{what}, got {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, got {text[:40]!r}") from None
    if not value > 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"seconds > 0, got {text[:40]!r}")
    return value


def _one_line_error(parser: argparse.ArgumentParser):
    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")
    return error


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve the playground page")
    s.error = _one_line_error(s)          # instead of argparse's usage block: one line, whatever went wrong
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=_integer(0, 65535, " (a TCP port)"), default=8000)
    s.add_argument("--models-dir", default=None,
                   help="the models to serve (default: $DECODING_PLAYGROUND_MODELS_DIR or the repository's models/)")
    s.add_argument("--allowed-origin", action="append", metavar="URL",
                   help="another origin whose pages may open the websockets (repeatable; default: own origin only)")
    s.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="another Host name the server answers to, e.g. behind a proxy (repeatable; '*': any). "
                        "Always: localhost, 127.0.0.1, [::1] and --host; others get 400 (DNS rebinding)")
    s.add_argument("--max-sessions", type=_integer(1), default=None, help="generations at once (default 8)")
    s.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                   help="memory all KV pools may hold together, e.g. 3GiB or 1500MiB (default: twice the pools "
                        "made at start-up); idle pools are freed to make room, a request whose pool cannot fit gets "
                        "an error")
    s.add_argument("--frame-ancestors", default=None,
                   help="CSP frame-ancestors of /embed: who may frame it (default '*')")
    s.add_argument("--max-queue", type=_integer(0), default=None,
                   help="starts that wait for a free slot (default 32); beyond, close 1013 'busy, retry'")
    s.add_argument("--max-connections", type=_integer(1), default=None,
                   help="websockets at once, watchers included (default 1000)")
    s.add_argument("--idle-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="stop a generation without progress or a client message for this long (default 600)")
    s.add_argument("--max-num-batched-tokens", type=_integer(0, what=" (0: no chunked prefill)"), default=None,
                   metavar="N", help="tokens an engine step computes: a longer prefill runs in chunks between the "
                                     "other sessions' steps (chunked prefill, as vLLM; 0: off; default: chunks of "
                                     "about 250 ms by each model's measured prefill speed)")
    s.add_argument("--suffix-cache", choices=("shared", "session"), default=None,
                   help="suffix decoding's global trees: 'shared' (default) drafts from every session's earlier "
                        "answers, as vLLM's one global tree does (in a room, from other people's answers); "
                        "'session': each page drafts only from its own earlier runs")
    s.add_argument("--suffix-decoding-max-tree-nodes", type=_integer(1, 100_000_000), default=None, metavar="N",
                   help="memory bound of suffix decoding's global trees: nodes plus cached responses of all of them "
                        "together, oldest response evicted first (default 1,000,000: about 110 MB)")
    s.add_argument("--token", default=None,
                   help="workshop mode: a shared secret required by page, API and websockets (?token=...); "
                        "DECODING_PLAYGROUND_TOKEN does the same without showing it in the process list")
    s.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="structured log lines as key=value pairs (default) or JSON; never prompts or tokens")
    s.add_argument("--openai-url", action=_OpenAIEngine, dest="openai", metavar="URL",
                   help="an OpenAI-compatible server to offer (vLLM, SGLang, llama-server), its base URL up to /v1; "
                        "repeatable. Its API key: $DECODING_PLAYGROUND_OPENAI_API_KEY")
    s.add_argument("--openai-model", action=_OpenAIEngine, dest="openai", metavar="NAME",
                   help="the model name to request from the preceding --openai-url")
    s.add_argument("--openai-metrics-url", action=_OpenAIEngine, dest="openai", metavar="URL",
                   help="the preceding --openai-url's Prometheus /metrics")
    s.add_argument("--no-llamacpp", action="store_true",
                   help="do not start llama.cpp's server on the fetched SmolLM2 GGUF (default: start it if it is there)")
    s.add_argument("--llamacpp-threads", type=_integer(1), default=1, metavar="N",
                   help="llama.cpp's threads (default 1)")
    s.add_argument("-t", "--threads", type=_integer(1, 256), default=None, metavar="N",
                   help="threads for the weight products of models that stream from memory (SmolLM2); our small "
                        "models stay on one (default: measured when SmolLM2 loads, logged with why)")
    v = s.add_mutually_exclusive_group()
    v.add_argument("--vllm", action="store_true", default=None,
                   help="start vLLM servers on the fetched SmolLM2 (make vllm installs vLLM; about 3.6 GB each; "
                        "$DECODING_PLAYGROUND_VLLM=1 does the same)")
    v.add_argument("--no-vllm", action="store_false", dest="vllm", help="do not start vLLM (the default)")
    s.add_argument("--vllm-threads", type=_integer(1), default=None, metavar="N",
                   help="each vLLM server's threads (default 1)")
    s.add_argument("--vllm-compile", action="store_true", default=None,
                   help="vLLM with torch.compile: decodes ~25%% faster, starts ~2.4x slower (default: eager)")
    s.add_argument("--vllm-port", type=_integer(1, 65535, " (a TCP port)"), default=None, metavar="PORT",
                   help="the first vLLM server's loopback port, the next ones' follow (default: free ones)")
    s.add_argument("--vllm-variants", default=None, metavar="LIST",
                   help="which vLLM servers, in the order they start: plain,ngram,eagle,draft_model (the default)")
    s.set_defaults(func=cmd_serve, parser=s)


# AppConfig's fields as `serve` spells them, and as the environment does (app/config.py)
OPTIONS = {"allowed_origins": "--allowed-origin", "allowed_hosts": "--allowed-host", "bind_host": "--host",
           "max_sessions": "--max-sessions", "kv_cache_memory": "--kv-cache-memory", "max_queue": "--max-queue",
           "max_connections": "--max-connections",
           "idle_timeout_s": "--idle-timeout", "token": "--token", "max_num_batched_tokens": "--max-num-batched-tokens",
           "embed_frame_ancestors": "--frame-ancestors", "openai_engines": "--openai-url",
           "llamacpp_threads": "--llamacpp-threads", "models_dir": "--models-dir", "vllm_threads": "--vllm-threads",
           "vllm_variants": "--vllm-variants", "vllm_port": "--vllm-port", "threads": "--threads",
           "suffix_cache": "--suffix-cache", "suffix_decoding_max_tree_nodes": "--suffix-decoding-max-tree-nodes"}
VARIABLES = {"idle_timeout_s": "IDLE_TIMEOUT", "embed_frame_ancestors": "FRAME_ANCESTORS"}


def variable(name: str) -> str:
    return "DECODING_PLAYGROUND_" + VARIABLES.get(name, name.upper())


def server_config(args):
    """The AppConfig of these options over the environment's; SystemExit(2) with one line for a bad one."""
    from pydantic import ValidationError

    from app.config import AppConfig, ConfigError

    parser = args.parser
    try:
        base = AppConfig.from_env()
    except ValidationError as e:
        err = e.errors()[0]
        parser.error(f"{variable(str(err['loc'][0]))}: {err['msg']}")
    except ConfigError as e:
        parser.error(f"{variable(e.field)}: {e.message}")
    overrides = dict(
        models_dir=args.models_dir, allowed_origins=tuple(args.allowed_origin) if args.allowed_origin else None,
        allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None, bind_host=args.host,
        max_sessions=args.max_sessions, kv_cache_memory=args.kv_cache_memory,
        embed_frame_ancestors=args.frame_ancestors, max_queue=args.max_queue,
        max_connections=args.max_connections, idle_timeout_s=args.idle_timeout, token=args.token,
        openai_engines=tuple(args.openai or ()), embedded_llamacpp=not args.no_llamacpp,
        llamacpp_threads=args.llamacpp_threads, max_num_batched_tokens=args.max_num_batched_tokens,
        threads=args.threads, vllm=args.vllm, vllm_threads=args.vllm_threads, vllm_port=args.vllm_port, vllm_compile=args.vllm_compile,
        vllm_variants=tuple(args.vllm_variants.split(",")) if args.vllm_variants else None,
        suffix_cache=args.suffix_cache, suffix_decoding_max_tree_nodes=args.suffix_decoding_max_tree_nodes,
        curve_at_start=True, freeze_gc=True)
    try:
        config = base.with_overrides(**overrides)
    except ConfigError as e:
        named = OPTIONS.get(e.field, e.field) if overrides.get(e.field) is not None else variable(e.field)
        parser.error(e.message if e.message.startswith("--") else f"{named}: {e.message}")
    if not (Path(config.models_dir) / "index.json").is_file():
        named = "--models-dir" if args.models_dir else variable("models_dir")
        parser.error(f"{named} {str(config.models_dir)[:200]}: no models there (no index.json)")
    try:
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        parser.error(f"--host {args.host[:60]!r}: not an address of this machine ({e})")
    return config


def cmd_serve(args) -> int:
    import logging

    config = server_config(args)

    import uvicorn

    from app.config import TRANSPORT_MAX_MESSAGE_BYTES
    from app.logs import configure
    from app.main import create_app
    from app.ws.transport import WS_PROTOCOL

    log_config = configure(args.log_format)
    log = logging.getLogger("app.serve")
    local = args.host in ("127.0.0.1", "localhost", "::1")
    exposure = "this machine only" if local else "REACHABLE FROM OTHER MACHINES"
    origins = ", ".join(config.allowed_origins) or "none"
    log.warning("serving on http://%s:%s (%s): page, JSON API, /metrics and websockets%s; websocket origins: "
                "the page's own%s; extra allowed origins: %s; at most %d generating sessions (%d more wait in line)",
                args.host, args.port, exposure, "" if config.token else ", without a token",
                "" if local else " (checked on every handshake)", origins, config.max_sessions, config.max_queue)
    if config.token:
        log.warning("workshop mode: every page, API call and websocket needs the token "
                    "(open http://%s:%s/?token=... ; /healthz and static files stay open)", args.host, args.port)
    elif not local:
        log.warning("no --token: anyone who can reach %s:%s can use this server", args.host, args.port)
    # The app answers a message over 64 KiB with an error; uvicorn's own limit is higher so that it does
    # not close the connection first (app/config.py). One process: sessions live in it.
    # WS_PROTOCOL: uvicorn's websocket protocol, a round's frames written to the socket at once (app/ws/transport.py).
    uvicorn.run(create_app(config), host=args.host, port=args.port, ws=WS_PROTOCOL,
                ws_max_size=TRANSPORT_MAX_MESSAGE_BYTES, ws_per_message_deflate=False, log_config=log_config,
                log_level="info", access_log=True)
    return 0
