"""How many threads the weight products of models that stream from memory run on (engine/model/threads.py):
`--threads N` (serve: or DECODING_PLAYGROUND_THREADS), else a rule on the cores this process may use. A server
leaves a core for its event loop and a browser beside it, as vLLM's CPU backend keeps one free (a helper process
holds its core for a whole run: docs/benchmarks.md, `bench page --model`); otherwise every core of a 2-3 core
machine, one free from 4 on, at most MAX_THREADS. A measurement at load would follow whatever else ran then.

    request_threads(None, serving=True)   # serve, before a model loads (None: the rule)
    choice = threads_for(model)           # when the first model that streams from memory loads: applied, logged
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from .layout import WeightStream
from .threads import read_chunked, set_threads, using_threads

logger = logging.getLogger(__name__)

MAX_THREADS = 8                # beyond this more readers add no bandwidth on the machines we know


def available_cores() -> int:  # the cores this process may run on (Linux), else the machine's
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def candidate_threads(cores: int, serving: bool = False) -> int:  # the rule's count, for a server or not
    return max(1, min(MAX_THREADS, cores - 1 if serving or cores > 3 else cores))


@dataclass
class ThreadChoice:
    threads: int
    reason: str
    cores: int = 1
    read_ms: dict[int, float] = field(default_factory=dict)    # threads -> a pass over the weights on them


def choose(requested: int | None, cores: int, serving: bool = False) -> ThreadChoice:
    """`requested` (--threads) where given, else the rule (`candidate_threads`); with why."""
    rule = candidate_threads(cores, serving)
    why = "one core available" if cores == 1 else f"{cores} cores, " + (
        f"at most {MAX_THREADS}" if MAX_THREADS == rule < cores - 1 else
        "a server leaves one for its event loop and a browser" if serving else
        "every one" if rule == cores else "one left free")
    if requested is None:
        return ThreadChoice(rule, why, cores)
    return ThreadChoice(requested, f"--threads {requested} (the default here would be {rule}: {why})", cores)


# the process's request (None: the rule) and choice; character models never ask for one
_requested: int | None = None
_serving = False
_choice: ThreadChoice | None = None
_choice_lock = threading.Lock()


def request_threads(requested: int | None, serving: bool = False) -> None:
    """`--threads N` (None: the rule, a server's leaving a core free). Applies at once to a model already loaded."""
    global _requested, _serving
    if requested is not None and not 1 <= requested <= 256:
        raise ValueError(f"threads must be between 1 and 256, got {requested}")
    _requested, _serving = requested, serving
    with _choice_lock:
        if _choice is not None:
            _settle(choose(requested, _choice.cores, serving), _choice.read_ms)


def threads_for(model) -> ThreadChoice:
    """The process's choice, applied the first time a model whose weights stream from memory loads, with one pass
    over its weights timed on that many threads: the floor a page shows (engine/model/loaded_model.py)."""
    with _choice_lock:
        if _choice is None:
            choice = choose(_requested, available_cores(), _serving)
            _settle(choice, {choice.threads: read_ms(model, choice.threads)} if choice.threads > 1 else {})
        return _choice


def _settle(choice: ThreadChoice, read_ms: dict[int, float]) -> None:
    global _choice
    choice.read_ms, _choice = read_ms, choice
    set_threads(choice.threads)
    logger.info("threads: %d for the weight products of memory-bound models: %s", choice.threads, choice.reason)


def read_ms(model, threads: int, passes: int = 3) -> float:
    """The fastest of `passes` passes over `model`'s weight bytes on `threads` threads, in ms."""
    stream, times = WeightStream(model), []
    with using_threads(threads) as pool:
        for _ in range(passes):
            t = time.perf_counter()
            read_chunked(stream.flat, pool)
            times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def current_choice() -> ThreadChoice | None:
    return _choice
