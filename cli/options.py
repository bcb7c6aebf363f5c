"""Command-line options more than one command takes."""
from __future__ import annotations

import argparse


def add_threads_argument(p) -> None:
    p.add_argument("-t", "--threads", type=threads_count, default=None, metavar="N",
                   help="threads for the weight products of models that stream from memory (SmolLM2); our small "
                        "models stay on one (default: measured when SmolLM2 loads, logged with why)")


def threads_count(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"between 1 and 256, got {n}")
    return n
