"""`decoding-playground` — one entry point, one subcommand per concern."""
from __future__ import annotations

import argparse
import sys

import engine  # noqa: F401  (pins BLAS to one thread before numpy is imported)


def cmd_serve(args) -> int:
    import uvicorn

    from app.config import AppConfig
    from app.main import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"WARNING: serving on {args.host}:{args.port}: reachable from other machines.", file=sys.stderr)
    config = AppConfig.from_env().with_overrides(
        models_dir=args.models_dir, allowed_origins=tuple(args.allowed_origin) if args.allowed_origin else None,
        max_sessions=args.max_sessions, embed_frame_ancestors=args.frame_ancestors)
    uvicorn.run(create_app(config), host=args.host, port=args.port, ws_max_size=64 * 1024,
                ws_per_message_deflate=False, log_level="info")
    return 0


def cmd_bench(args) -> int:
    from cli import bench
    return bench.run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decoding-playground",
                                description="Watch an LLM decode: KV cache, paged blocks, speculative decoding.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the playground page")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--models-dir", default=None,
                   help="the models to serve (default: $DECODING_PLAYGROUND_MODELS_DIR or the repository's models/)")
    s.add_argument("--allowed-origin", action="append", metavar="URL",
                   help="another origin whose pages may open the websockets (repeatable; default: own origin only)")
    s.add_argument("--max-sessions", type=int, default=None, help="generations at once (default 8)")
    s.add_argument("--frame-ancestors", default=None,
                   help="CSP frame-ancestors of /embed: who may frame it (default '*')")
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="measure the engine (results also go to docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    be = bsub.add_parser("engine", help="decode, prefill, prefix reuse, GQA attention, KV bytes")
    be.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run, a few seconds)")
    be.add_argument("--json", action="store_true", help="print the results as JSON")
    be.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    be.add_argument("--models-dir", default=None, help="models for the speculative sweep (default: models/)")
    be.set_defaults(func=cmd_bench)
    from cli import bench_page
    bench_page.add_parser(bsub)
    from cli import bench_smollm2
    bench_smollm2.add_parser(bsub)

    from cli import fetch, generate
    generate.add_parsers(sub)
    fetch.add_parser(sub)

    try:
        from engine.training import cli as training_cli
    except ImportError:
        training_cli = None
    if training_cli is not None and hasattr(training_cli, "add_parser"):
        training_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
