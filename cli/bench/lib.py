"""What every bench shares: runs in turns, paired speed-ups (compare.py's band and verdict), the machine line,
tables, and the sections of docs/benchmarks.md (generated text only between a section's markers).
"""
from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from engine.experiments.compare import abba_order, speedup
from engine.kv.cache import KVCacheManager
from engine.model.llama import forward
from engine.serving.session import GenerationSession

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


# --- runs taken in turns ------------------------------------------------------------------------------------------
def take_turns(sides: dict, repeats: int, abba: bool = True) -> dict[str, list]:
    """Each side's results over `repeats` rounds, in A B, B A order (abba=False: always in order, a 'cold' figure)."""
    out: dict[str, list] = {name: [] for name in sides}
    for name in abba_order(list(sides), repeats) if abba else list(sides) * repeats:
        out[name].append(sides[name]())
    return out


def timer(fn, runs: int = 1, warm: int = 0):
    """A side for `take_turns`: `warm` untimed calls of fn, then `runs` timed ones; their ms."""
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


def by_key(results: list[dict]) -> dict:
    """Turns that each return a dict of figures, as one list of values per key."""
    return {k: [r[k] for r in results] for k in results[0]} if results else {}


def paired(before: list, after: list) -> dict:
    """How much faster `after` is than `before`, round by round: compare.py's median, band and verdict."""
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
    """(busy CPU seconds of the machine since boot, of this process and its children)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    own = os.times()
    return ((sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), own.user + own.system + own.children_user
            + own.children_system + cpu_seconds([c.pid for c in multiprocessing.active_children()]))


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
        blas = (f"{(blas.get('openblas configuration') or blas['name']).split()[0]} "
                + ".".join(str(blas["version"]).split(".")[:3]))
    except (KeyError, TypeError, AttributeError):
        blas = "BLAS"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
            "load": round(os.getloadavg()[0], 2), "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "started": [time.monotonic(), *busy_seconds()]}


def machine_line(m: dict) -> str:
    """The section's last line, with the cores other processes kept busy since `machine()`."""
    if "started" in m:
        t0, machine0, ours0 = m.pop("started")
        machine1, ours1 = busy_seconds()
        m["others_cores"] = round(max(0.0, machine1 - machine0 - ours1 + ours0) / (time.monotonic() - t0), 2)
    threads = m["blas_threads"]
    return (f"Machine: {m['cpu']} ({m['cores']} cores), Python {m['python']}, numpy {m['numpy']}, {m['blas']}, "
            f"{threads} BLAS thread{'' if threads == '1' else 's'}; load {m['load']:.1f}, other processes "
            f"{m['others_cores']:.2f} cores during the run; {m['date']}")


# --- tables and sections --------------------------------------------------------------------------------------------
def table(header: list[str], rows: list[list], title: str | None = None) -> str:
    """A markdown table from rows of cells: None shown '–', booleans yes / **no**, floats to 2 decimals."""
    def cell(x) -> str:
        return ("–" if x is None else ("yes" if x else "**no**") if isinstance(x, bool)
                else f"{x:.2f}" if isinstance(x, float) else str(x))
    lines = [f"**{title}**", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows])


def s_shown(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f} s"


def ms_shown(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f} ms"


def goals(rows: list[tuple]) -> str:
    """A table of goals from (what, measured, "<=" or ">=", bound[, the measured value as shown]) rows."""
    return table(["goal", "measured", "target", "met"],
                 [[what, shown_as[0] if shown_as else v, f"{op} {bound:g}", v is not None and (
                     v <= bound if op == "<=" else v >= bound)] for what, v, op, bound, *shown_as in rows])


def write_section(name: str, body: str, docs: Path | None = None) -> None:
    """Replace the text between the section's markers (a new section at the end when it has none)."""
    docs = docs or DOCS
    start, end = f"<!-- bench {name}: start -->", f"<!-- bench {name}: end -->"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## `bench {name}`\n\n{block}\n"
    docs.write_text(text)


def add_bench(bsub, name: str, help: str, measure, tables, quick: str | None = None, models_dir: bool = False):
    """`bench NAME`: measure(args) -> results ('section', default NAME; 'ok'; 'machine', default the machine's facts
    as the run starts), tables(results) -> the section's tables."""
    parser = bsub.add_parser(name, help=help)
    if quick:
        parser.add_argument("--quick", action="store_true", help=f"{quick} (a smoke run; writes nothing)")
    if models_dir:
        parser.add_argument("--models-dir", default=None, help="the models to run (default: models/)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")

    def run(args) -> int:
        r = {"machine": machine(), **measure(args)}
        section, line = r.setdefault("section", name), machine_line(r["machine"])
        text = "\n\n".join([*tables(r), line])
        print(json.dumps(r, indent=1, default=str) if args.json else text, flush=True)
        if not args.no_write and not getattr(args, "quick", False):
            write_section(section, text)
            print(f"(written to {DOCS}, section `bench {section}`)", file=sys.stderr)
        return 0 if r.get("ok", True) else 1
    parser.set_defaults(func=run, measure=measure)
    return parser


# --- generations --------------------------------------------------------------------------------------------------
def generate_process(prompt: str, settings: dict, models_dir=None) -> dict:
    """A fresh `generate --json` process, `settings` as its flags: its summary."""
    cmd = [sys.executable, "-m", "cli.main", "generate", "--json", "--prompt", prompt]
    cmd += [x for k, v in settings.items()
            for x in ("--" + k.replace("_", "-"), str(v).lower() if isinstance(v, bool) else str(v))]
    done = subprocess.run(cmd + (["--models-dir", str(models_dir)] if models_dir else []), capture_output=True,
                          text=True, timeout=900, cwd=DOCS.parents[1], env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"generate failed: {done.stderr[-800:]}")
    return json.loads(done.stdout)


def generation(engine, prompt: str, settings: dict) -> tuple[float, dict, object]:
    """One fresh session run to its end: (wall seconds, its summary, the session)."""
    t = time.perf_counter()
    session = GenerationSession(engine, prompt, settings)
    last = None
    for last in session.events():
        pass
    if last is None or last.type != "done":
        raise RuntimeError(f"generation failed: {getattr(last, 'message', 'no events')}")
    return time.perf_counter() - t, last.summary, session


def forward_after(model, tokens, context: int):
    """A function of n: one forward over n rows after `context` cached ones, rolled back after."""
    mgr = KVCacheManager(model.cfg, num_blocks=context // 16 + 3, block_size=16, enable_prefix_caching=False)
    seq = mgr.new_sequence()
    forward(model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))

    def rows(n: int = 1, through=None) -> None:
        new = tokens[context:context + n]
        forward(through or model, new, context, mgr.append_slots(seq, new))
        mgr.truncate(seq, context)
    return rows
