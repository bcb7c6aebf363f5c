"""How many threads the weight products of models that stream from memory run on (engine/model/threads.py):
`--threads N`, else measured on the machine it runs on when the first such model loads (engine/model/fetched.py).

The measurement times, per thread count and taking turns, a one-token forward of the model (a decode step's
products) and one pass over its weight bytes (the step's floor: the roofline per thread count that the Cost
model view shows), and keeps the fewest threads unless more make the step STEP_GAIN faster in the median
round: each round's step times are a pair taken moments apart, so one round that flatters either count does
not decide, and the bandwidth a shared machine lends or withdraws over seconds cancels out. The read does not
decide: on a host whose memory other machines share, the pool's threads read the weights as little as 1.0x
faster on two threads while the step, its products shared with a helper process, ran 1.3x faster
(docs/benchmarks.md). A default takes every core of a 2-3 core machine (a helper that finds its core busy takes
no chunks: the browser and the event loop cost the step its speed-up, not a stall) and leaves one core free from 4
cores on. The choice is logged with the figures that made it.

    request_threads(None)            # the measured default (serve and generate: --threads N)
    choice = threads_for(model)      # measured once per process, applied, logged
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .layout import WeightStream, weight_bytes
from .llama import forward
from .threads import read_chunked, set_threads, stop_other_processes, threads

logger = logging.getLogger(__name__)

MAX_THREADS = 8                # beyond this more readers add no bandwidth on the machines we know
STEP_GAIN = 1.05               # more threads must make the measured step at least this much faster


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def candidate_threads(cores: int, serving: bool = False) -> int:
    """The most threads a default may use: every core on a 2-3 core machine, one left free from 4 on, at most
    MAX_THREADS. A server (`serving`) leaves one core free on every machine, for its event loop and a browser
    beside it: a helper process holds its core for the whole of a run, so on 2 cores a second thread gives a page
    in a browser beside the server nothing (docs/benchmarks.md, `bench page --model`)."""
    return max(1, min(MAX_THREADS, cores - 1 if serving or cores > 3 else cores))


@dataclass
class ThreadChoice:
    threads: int
    reason: str
    cores: int = 1
    step_ms: dict[int, float] = field(default_factory=dict)     # threads -> fastest decode step's products
    read_ms: dict[int, float] = field(default_factory=dict)     # threads -> fastest pass over the weights
    gain: dict[int, float] = field(default_factory=dict)        # threads -> median of rounds' step(1) / step(n)
    weight_bytes: int = 0
    auto_threads: int = 1                                        # what the measurement chose, --threads aside
    auto_reason: str = ""

    def read_gb_per_s(self) -> dict[int, float]:
        return {n: self.weight_bytes / ms / 1e6 for n, ms in self.read_ms.items()}

    def as_dict(self) -> dict:
        return {"threads": self.threads, "reason": self.reason, "cores": self.cores, "step_ms": self.step_ms,
                "read_ms": self.read_ms, "read_gb_per_s": self.read_gb_per_s(), "gain": self.gain,
                "weight_bytes": self.weight_bytes, "auto_threads": self.auto_threads}


def measure_threads(model, counts, rounds: int = 5) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Ms per round, per thread count, of a one-token forward of `model` (a layout model: its products are a
    decode step's) and of one pass over its weight bytes, the counts taking turns round by round. Leaves the
    pool as it was."""
    before = threads()
    stream = WeightStream(model)
    token = np.array([min(2, model.cfg.vocab_size - 1)])
    step, read = {n: [] for n in counts}, {n: [] for n in counts}
    try:
        for _ in range(rounds):
            for n in counts:
                p = set_threads(n)
                t = time.perf_counter()
                forward(model, token, 0, None, last_only=True)
                step[n].append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter()
                read_chunked(stream.flat, p)
                read[n].append((time.perf_counter() - t) * 1e3)
    finally:
        set_threads(before)
    return step, read


def choose_threads(model, cores: int | None = None, rounds: int = 5, serving: bool = False) -> ThreadChoice:
    """The thread count for `model`'s products, measured for 1 .. `candidate_threads(cores)` (`rounds` turns
    each): the fewer threads unless more make the step STEP_GAIN faster (`pick`), at most
    `candidate_threads(cores, serving)`."""
    cores = cores or available_cores()
    counts = list(range(1, candidate_threads(cores) + 1))
    step, read = measure_threads(model, counts, rounds)
    gain = {n: float(np.median([a / b for a, b in zip(step[1], step[n])])) for n in counts}
    choice = ThreadChoice(1, "", cores, {n: min(v) for n, v in step.items()}, {n: min(v) for n, v in read.items()},
                          gain, weight_bytes(model))
    pick(choice, serving)
    return choice


def pick(choice: ThreadChoice, serving: bool) -> None:
    """Set `choice.threads` and its reason from its measurements, up to `candidate_threads(cores, serving)`: more
    threads where their median gain over one thread beats the fewer threads' by STEP_GAIN."""
    step, gain, cores = choice.step_ms, choice.gain, choice.cores
    top = candidate_threads(cores, serving)
    gbps = choice.read_gb_per_s()
    facts = "; ".join(f"{n} thread{'s' * (n > 1)}: step {step[n]:.1f} ms, read {gbps[n]:.1f} GB/s" for n in step)
    best = 1
    for n in range(2, top + 1):
        if gain.get(n, 0.0) >= gain.get(best, 1.0) * STEP_GAIN:
            best = n
    choice.threads = best
    if best > 1:
        why = f"{best} threads make the step {gain[best]:.2f}x as fast as one (the median round)"
    elif top == 1:
        why = "a server leaves one core for its event loop and a browser" if serving and cores > 1 else \
            "one core available"
    else:
        why = f"more threads did not make the step {STEP_GAIN - 1:.0%} faster in the median round (" + ", ".join(
            f"{n} threads {g:.2f}x" for n, g in gain.items() if n > 1) + ")"
    choice.reason = f"{why} ({cores} cores, up to {top} {'for a server ' if serving else ''}tried; {facts})"


# The process's choice: `--threads` (None: measure), and what was measured when the first model whose
# weights stream from memory loaded (engine/model/fetched.py); character models never ask.
_requested: int | None = None
_serving = False
_choice: ThreadChoice | None = None
_choice_lock = threading.Lock()


def request_threads(requested: int | None, serving: bool = False) -> None:
    """`--threads N` (None: the measured default, a server's leaving a core free: `candidate_threads`). Applies
    at once to a model already loaded."""
    global _requested, _serving
    if requested is not None and not 1 <= requested <= 256:
        raise ValueError(f"threads must be between 1 and 256, got {requested}")
    _requested, _serving = requested, serving
    with _choice_lock:
        if _choice is not None:
            _settle(_choice)


def _settle(choice: ThreadChoice) -> None:
    pick(choice, _serving)
    choice.auto_threads, choice.auto_reason = choice.threads, choice.reason
    if _requested is not None:
        choice.threads = _requested
        choice.reason = f"--threads {_requested} (measured here, the default would be {choice.auto_threads}: " \
                        f"{choice.auto_reason})"
    else:
        choice.threads, choice.reason = choice.auto_threads, choice.auto_reason
    set_threads(choice.threads)
    stop_other_processes()                   # the measurement's other pools hold shares of the weights
    logger.info("threads: %d for the weight products of models that stream from memory: %s",
                choice.threads, choice.reason)


def threads_for(model) -> ThreadChoice:
    """The process's thread choice, measured on `model` (a layout model, just loaded) the first time."""
    global _choice
    with _choice_lock:
        if _choice is None:
            choice = choose_threads(model)
            _choice = choice
            _settle(choice)
        return _choice


def current_choice() -> ThreadChoice | None:
    return _choice
