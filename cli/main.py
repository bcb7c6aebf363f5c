"""`decoding-playground` — one entry point, one subcommand per concern."""
from __future__ import annotations

import argparse
import sys

import engine  # noqa: F401  (pins BLAS to one thread before numpy is imported)


def cmd_bench(args) -> int:
    from cli.bench import engine as bench
    return bench.run(args)


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
        from engine.training import head_cli
        head_cli.add_parser(sub)
    return p


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
    from cli.bench import views as bench_views
    bench_views.add_parser(bsub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:       # said by the subcommand's parser (serve's says it in one line)
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)[:200]}")
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
