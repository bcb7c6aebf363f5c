"""`decoding-playground` — one entry point, one subcommand per concern."""
from __future__ import annotations

import argparse
import sys

import engine  # noqa: F401  (pins BLAS to one thread before numpy is imported)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decoding-playground",
                                description="Watch an LLM decode: KV cache, paged blocks, speculative decoding.")
    sub = p.add_subparsers(dest="command", required=True)
    from cli import serve
    serve.add_parser(sub)
    add_bench_parsers(sub)

    from cli import export_page, fetch, generate
    generate.add_parsers(sub)
    fetch.add_parser(sub)
    export_page.add_parser(sub)

    try:
        from engine.training import cli as training_cli
    except ImportError:
        training_cli = None
    if training_cli is not None and hasattr(training_cli, "add_parser"):
        training_cli.add_parser(sub)
        from engine.training import draft_cli, head_cli
        head_cli.add_parser(sub)
        draft_cli.add_parser(sub)
    return p


def add_bench_parsers(sub) -> None:
    from cli.bench import engine, engines, faults, heads, page, serve, smollm2, suffix, views

    b = sub.add_parser("bench", help="measure the engine (results also go to docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    for bench in (engine, page, smollm2, heads, serve, engines, faults, views, suffix):
        bench.add_parser(bsub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:       # said by the subcommand's parser (serve's says it in one line)
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)[:200]}")
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
