"""What every bench shares: runs taken in turns, medians and bands, the machine line, tables from rows, and the
sections of docs/benchmarks.md.

A bench compares things measured in one run, taking turns (`take_turns`), so that the noise of a shared machine
hits every side alike; a speed-up is the median of its rounds' ratios, with the band and verdict of
engine/experiments/compare.py's rule (`paired`). Between a section's markers a bench writes generated text only:
its tables, then one machine line; the prose around them belongs to the doc.
"""
from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from engine.experiments.compare import abba_order, median_band, speedup
from engine.kv.cache import KVCacheManager
from engine.model.llama import forward
from engine.serving.session import GenerationSession

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


# --- runs taken in turns ------------------------------------------------------------------------------------------
def take_turns(sides: dict, repeats: int, abba: bool = True) -> dict[str, list]:
    """Each side's results over `repeats` rounds, every side once a round: in order and reversed by turns (A B,
    B A, ...: a drift of the machine hits every side alike), or with abba=False always in order (each side right
    after the same other one: a 'cold' figure)."""
    names = list(sides)
    out: dict[str, list] = {name: [] for name in names}
    for name in abba_order(names, repeats) if abba else names * repeats:
        out[name].append(sides[name]())
    return out


def timer(fn, runs: int = 1, warm: int = 0):
    """A side for `take_turns`: `warm` untimed calls of fn (its weights and cache back in the CPU's caches, as in
    a run of consecutive calls), then `runs` timed ones; their ms."""
    def side() -> list[float]:
        for _ in range(warm):
            fn()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return times
    return side


def pooled(values: list) -> list:
    """A side's results with the lists among them (a turn's timed calls) flattened."""
    return [x for v in values for x in (v if isinstance(v, list) else [v])]


def by_key(results: list[dict]) -> dict[object, list]:
    """Turns that each return a dict of figures, as one list of values per key."""
    out: dict = {}
    for r in results:
        for k, v in r.items():
            out.setdefault(k, []).append(v)
    return out


def medians(results: dict) -> dict:
    return {k: statistics.median(pooled(v)) for k, v in results.items()}


def band(values: list) -> tuple[float, float]:
    """The range around the median of `values` that holds it with at least 75% confidence (compare.py)."""
    return median_band(pooled(values))


def paired(before: list, after: list) -> dict:
    """How much faster `after` is than `before`, from their times (ms, s) round by round: each round's ratio
    before / after, their median, band and verdict (engine/experiments/compare.py's rule)."""
    ratios = [a / b if a and b else None for a, b in zip(before, after)]
    return speedup(ratios, len(ratios))


def paired_rates(before: list[dict], after: list[dict], key: str = "tokens_per_s") -> dict:
    """`paired` from runs that each give a rate (tokens/s) under `key`."""
    return paired([1 / r[key] for r in before], [1 / r[key] for r in after])


def shown(s: dict | None) -> str:
    """A `paired` speed-up as a table shows it: '1.31x (1.27-1.36, faster)'; '–' when not measured."""
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median']:.2f}x ({s['low']:.2f}-{s['high']:.2f}, {s['verdict']})"


# --- the machine ----------------------------------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far, from /proc (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine since boot, of this process and its children: those that ended and
    those still running, such as helper processes and servers)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    own = os.times()
    running = cpu_seconds([c.pid for c in multiprocessing.active_children()])
    return ((sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system + running)


def machine() -> dict:
    """This machine's facts, read when a run starts (the load before the bench adds its own)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = (blas.get("openblas configuration") or blas["name"]).split()[0]
        blas = f"{name} {'.'.join(str(blas['version']).split('.')[:3])}"
    except (KeyError, TypeError, AttributeError):
        blas = "BLAS"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
            "load": round(os.getloadavg()[0], 2), "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "started": [time.monotonic(), *busy_seconds()]}


def settle(m: dict) -> dict:
    """The machine facts at the end of a run: the cores other processes kept busy meanwhile."""
    if "started" in m:
        t0, machine0, ours0 = m.pop("started")
        machine1, ours1 = busy_seconds()
        m["others_cores"] = round(max(0.0, (machine1 - machine0) - (ours1 - ours0)) / max(1e-9, time.monotonic() - t0), 2)
    return m


def machine_line(m: dict) -> str:
    threads = m["blas_threads"]
    others = f", other processes {m['others_cores']:.2f} cores during the run" if "others_cores" in m else ""
    return (f"Machine: {m['cpu']} ({m['cores']} cores), Python {m['python']}, numpy {m['numpy']}, {m['blas']}, "
            f"{threads} BLAS thread{'' if threads == '1' else 's'}; load {m['load']:.1f}{others}; {m['date']}")


# --- tables and sections --------------------------------------------------------------------------------------------
def cell(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def table(header: list[str], rows: list[list], title: str | None = None) -> str:
    """A markdown table from rows of cells (`cell`: None '–', booleans yes / **no**, floats to 2 decimals)."""
    lines = [f"**{title}**", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows])


def write_section(name: str, body: str, docs: Path | None = None) -> None:
    """Replace the text between `<!-- bench NAME: start -->` and `<!-- bench NAME: end -->` (a new section with a
    heading at the end of the doc when it has none)."""
    docs = docs or DOCS
    start, end = f"<!-- bench {name}: start -->", f"<!-- bench {name}: end -->"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## `bench {name}`\n\n{block}\n"
    docs.write_text(text)


def output_flags(parser, models_dir: bool = False) -> None:
    """The options every bench takes."""
    if models_dir:
        parser.add_argument("--models-dir", default=None, help="the models to run (default: models/)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")


def emit(args, name: str, r: dict, tables: list[str], write: bool = True) -> None:
    """Print a run (JSON with --json, else its section) and write its section unless --no-write. `r["machine"]`:
    `machine()` from the start of the run."""
    settle(r["machine"])
    text = "\n\n".join([*tables, machine_line(r["machine"])])
    print(json.dumps(r, indent=1, default=str) if getattr(args, "json", False) else text, flush=True)
    if write and not getattr(args, "no_write", False):
        write_section(name, text)
        print(f"(written to {DOCS}, section `bench {name}`)", file=sys.stderr)


def add_bench(bsub, name: str, help: str, measure, tables, quick: str | None = None, models_dir: bool = False):
    """`bench NAME`: measure(args) -> a run's results (with `machine()` from its start; "section": another section
    than NAME's; "ok": False, exit 1), tables(results) -> its section's tables. --quick runs write nothing."""
    parser = bsub.add_parser(name, help=help)
    if quick:
        parser.add_argument("--quick", action="store_true", help=f"{quick} (a smoke run; writes nothing)")
    output_flags(parser, models_dir)

    def run(args) -> int:
        r = measure(args)
        emit(args, r.pop("section", name), r, tables(r), write=not getattr(args, "quick", False))
        return 0 if r.get("ok", True) else 1
    parser.set_defaults(func=run, measure=measure)
    return parser


# --- generations --------------------------------------------------------------------------------------------------
def generate_process(prompt: str, settings: dict, models_dir=None) -> dict:
    """A fresh `decoding-playground generate --json` process, as a user runs it: its summary. `settings` become its
    flags (dashes for underscores; threads: `--threads`)."""
    cmd = [sys.executable, "-m", "cli.main", "generate", "--json", "--prompt", prompt]
    cmd += [x for k, v in settings.items() for x in ("--" + k.replace("_", "-"), str(v).lower() if isinstance(v, bool)
                                                     else str(v))]
    if models_dir:
        cmd += ["--models-dir", str(models_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=DOCS.parents[1],
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"generate failed: {done.stderr[-800:]}")
    return json.loads(done.stdout)


def generation(engine, prompt: str, settings: dict) -> tuple[float, dict, object]:
    """One fresh session run to its end, as `generate` runs one: (wall seconds from its creation to `done`, its
    summary, the session)."""
    t = time.perf_counter()
    session = GenerationSession(engine, prompt, settings)
    last = None
    for last in session.events():
        pass
    if last is None or last.type != "done":
        raise RuntimeError(f"generation failed: {getattr(last, 'message', 'no events')}")
    return time.perf_counter() - t, last.summary, session


class JsonWorker:
    """A process that answers each JSON line on its stdin with one on its stdout: our engine or another one held
    ready in a process of its own (another thread count, another virtual environment)."""

    def __init__(self, cmd: list[str], env: dict, quiet: bool = False):
        self.proc = subprocess.Popen(cmd, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     stderr=subprocess.DEVNULL if quiet else None)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker {self.proc.args[1:3]} ended (exit {self.proc.wait()})")
        return json.loads(line)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def forward_after(model, tokens, context: int):
    """A function of n that runs one forward over tokens[context:context + n] after `context` cached ones and rolls
    it back, so that every call is the same step (`through`: a model standing in for this one)."""
    mgr = KVCacheManager(model.cfg, num_blocks=context // 16 + 3, block_size=16, enable_prefix_caching=False)
    seq = mgr.new_sequence()
    forward(model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))

    def rows(n: int = 1, through=None) -> None:
        new = tokens[context:context + n]
        forward(through or model, new, context, mgr.append_slots(seq, new))
        mgr.truncate(seq, context)
    return rows
