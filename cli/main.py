"""`decoding-playground` — one entry point, one subcommand per concern."""
from __future__ import annotations

import argparse
import sys

import engine  # noqa: F401  (pins BLAS to one thread before numpy is imported)


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


def cmd_serve(args) -> int:
    import logging

    import uvicorn

    from app.config import TRANSPORT_MAX_MESSAGE_BYTES, AppConfig
    from app.logs import configure
    from app.main import create_app
    from app.ws.transport import WS_PROTOCOL

    log_config = configure(args.log_format)
    log = logging.getLogger("app.serve")
    config = AppConfig.from_env().with_overrides(
        models_dir=args.models_dir, allowed_origins=tuple(args.allowed_origin) if args.allowed_origin else None,
        allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None, bind_host=args.host,
        max_sessions=args.max_sessions, embed_frame_ancestors=args.frame_ancestors, max_queue=args.max_queue,
        max_connections=args.max_connections, idle_timeout_s=args.idle_timeout, token=args.token,
        openai_engines=tuple(args.openai or ()), embedded_llamacpp=not args.no_llamacpp,
        llamacpp_threads=args.llamacpp_threads, max_num_batched_tokens=args.max_num_batched_tokens,
        threads=args.threads)
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


def cmd_bench(args) -> int:
    from cli.bench import engine as bench
    return bench.run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decoding-playground",
                                description="Watch an LLM decode: KV cache, paged blocks, speculative decoding.")
    sub = p.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_bench_parsers(sub)

    from cli import fetch, generate
    generate.add_parsers(sub)
    fetch.add_parser(sub)

    try:
        from engine.training import cli as training_cli
    except ImportError:
        training_cli = None
    if training_cli is not None and hasattr(training_cli, "add_parser"):
        training_cli.add_parser(sub)
        from engine.training import head_cli
        head_cli.add_parser(sub)
    return p


def add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve the playground page")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--models-dir", default=None,
                   help="the models to serve (default: $DECODING_PLAYGROUND_MODELS_DIR or the repository's models/)")
    s.add_argument("--allowed-origin", action="append", metavar="URL",
                   help="another origin whose pages may open the websockets (repeatable; default: own origin only)")
    s.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="another Host name the server answers to, e.g. behind a proxy (repeatable; '*': any). "
                        "Always: localhost, 127.0.0.1, [::1] and --host; others get 400 (DNS rebinding)")
    s.add_argument("--max-sessions", type=int, default=None, help="generations at once (default 8)")
    s.add_argument("--frame-ancestors", default=None,
                   help="CSP frame-ancestors of /embed: who may frame it (default '*')")
    s.add_argument("--max-queue", type=int, default=None,
                   help="starts that wait for a free slot (default 32); beyond, close 1013 'busy, retry'")
    s.add_argument("--max-connections", type=int, default=None,
                   help="websockets at once, watchers included (default 1000)")
    s.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a generation without progress or a client message for this long (default 600)")
    s.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="tokens an engine step computes: a longer prefill runs in chunks between the other "
                        "sessions' steps (chunked prefill, as vLLM; default 8, 0: off)")
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
    s.add_argument("--llamacpp-threads", type=int, default=1, metavar="N", help="llama.cpp's threads (default 1)")
    add_threads_argument(s)
    s.set_defaults(func=cmd_serve)


def add_threads_argument(p) -> None:
    p.add_argument("-t", "--threads", type=threads_count, default=None, metavar="N",
                   help="threads for the weight products of models that stream from memory (SmolLM2); our small "
                        "models stay on one (default: measured when SmolLM2 loads, logged with why)")


def threads_count(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"between 1 and 256, got {n}")
    return n


def add_bench_parsers(sub) -> None:
    b = sub.add_parser("bench", help="measure the engine (results also go to docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    be = bsub.add_parser("engine", help="decode, prefill, prefix reuse, GQA attention, KV bytes")
    be.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run, a few seconds)")
    be.add_argument("--json", action="store_true", help="print the results as JSON")
    be.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    be.add_argument("--models-dir", default=None, help="models for the speculative sweep (default: models/)")
    be.set_defaults(func=cmd_bench)
    from cli.bench import page as bench_page
    bench_page.add_parser(bsub)
    from cli.bench import smollm2 as bench_smollm2
    bench_smollm2.add_parser(bsub)
    from cli.bench import heads as bench_heads
    bench_heads.add_parser(bsub)
    from cli.bench import serve as bench_serve
    bench_serve.add_parser(bsub)
    from cli.bench import engines as bench_engines
    bench_engines.add_parser(bsub)
    from cli.bench import faults as bench_faults
    bench_faults.add_parser(bsub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
