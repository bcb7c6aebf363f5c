"""Side measurements for `bench smollm2`: how fast numpy streams SmolLM2-135M's 538 MB of weights, several ways.

    .venv/bin/python scripts/weight_stream_experiments.py layouts [--repeats 15]
    .venv/bin/python scripts/weight_stream_experiments.py bytes [--repeats 9]
    .venv/bin/python scripts/weight_stream_experiments.py threads [--rounds 3]
    .venv/bin/python scripts/weight_stream_experiments.py panels [--repeats 11]
    .venv/bin/python scripts/weight_stream_experiments.py variance [--rounds 60]
    .venv/bin/python scripts/weight_stream_experiments.py coretypes [--rounds 2] [--repeats 7]
    .venv/bin/python scripts/weight_stream_experiments.py pool [--repeats 9]

- layouts: one pass of products over matrices of SmolLM2's shapes (random float32: timing does not depend
  on the values) for 1, 2, 3, 5 and 9 rows, per layout and call pattern, against a bare read of the bytes.
- bytes: the same one-row pass with weights stored in fewer bytes (float16, bfloat16, int8 with per-column
  scales), each 1 MB piece converted to float32 just before its product, against float32.
- threads: decode steps, a 5-row verification and a prefill of the draft, target-mha and SmolLM2 (the layout
  engine/model/layout.py chooses) in processes with OPENBLAS_NUM_THREADS=1 and 2, alternated.
- panels: the one-row pass over panels of 32-128 columns, and over 64-column panels stacked r at a time and
  multiplied by a block-diagonal [r, r C] of the row (r times fewer calls, the same multiply count at r = 2).
- variance: SmolLM2 itself (fetched), round after round: the bare read, the step's one-row products alone, a
  whole decode step at a 256-token context and a compute probe (as many small GEMMs on a cache-resident
  panel); the spread of each and the per-round ratios to the read.
- coretypes: the one-row pass as [out, in] `W @ x`, as [in, out] `x @ W`, over 64-column panels as one row
  and as two (the engine's), against the bare read, in a process per OpenBLAS kernel set (OPENBLAS_CORETYPE:
  numpy's OpenBLAS picks one for the CPU at start-up; the variable makes it use another), alternated.
- pool: one pass of one-row products over SmolLM2's shapes (both layouts), on 1 thread and on 2:
  engine/model/threads.py's pool sharing every product at several chunk sizes (CHUNK_BYTES; one chunk per
  thread), and each shape the way its running averages found faster (as served), and OpenBLAS's
  own threads (openblas_set_num_threads, [out, in] only: it does not thread the panels' small GEMMs), with the
  bare read on 1 and 2 threads, and the CPU other processes used meanwhile.
Figures are per-thread CPU time (time.thread_time) for `layouts`, `bytes`, `panels` and `coretypes` (min / median ms),
which leaves out the time other processes hold the core but not their use of the memory bus; wall time for
`threads` and `variance`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import engine  # noqa: E402,F401  (BLAS threads pinned unless set)
from engine.model.layout import FEW_ROWS, OutInWeight, PanelWeight  # noqa: E402

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]   # [in, out], as x @ W


def timed(fns: dict, repeats: int, clock=time.thread_time, show: bool = True) -> dict:
    """ms of each function per round, the functions taking turns; printed as min / median unless `show` is off."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = clock()
            fn()
            times[k].append((clock() - t) * 1e3)
    if show:
        for k, v in times.items():
            print(f"{k:44s} {min(v):7.1f} / {statistics.median(v):7.1f} ms")
    return times


def layouts(repeats: int) -> None:
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    panels, out_in = [PanelWeight(a) for a in w], [OutInWeight(a) for a in w]
    x = {n: [rng.standard_normal((n, s[0]), dtype=np.float32) for s in SHAPES] for n in (1, 2, 3, 5, FEW_ROWS)}

    def run(weights, n, how):
        return lambda: [how(lw, xi) for lw, xi in zip(weights, x[n])]

    fns = {"bare read (BLAS dot of each array with itself)": lambda: [np.dot(v, v) for v in
                                                                       (p.data.reshape(-1) for p in panels)],
           "1 row: [out, in] W @ x (GEMV)": run(out_in, 1, lambda lw, xi: lw.vec(xi[0])),
           "1 row: [in, out] x @ W (GEMV)": run(w, 1, lambda a, xi: np.dot(xi[0], a)),
           "1 row: panels, one row (GEMV per panel)": run(panels, 1, lambda lw, xi: np.matmul(xi[0], lw.panels)),
           "1 row: panels, as two rows (small GEMM)": run(panels, 1, lambda lw, xi: lw.vec(xi[0]))}
    for n in (2, 3, 5, FEW_ROWS):
        fns[f"{n} rows: panels"] = run(panels, n, lambda lw, xi: lw.rows(xi))
        fns[f"{n} rows: [out, in] blocks, a GEMV per row"] = run(out_in, n, lambda lw, xi: lw.rows(xi))
        fns[f"{n} rows: [out, in] whole, X @ W.T (GEMM)"] = run(out_in, n, lambda lw, xi: np.dot(xi, lw.t.T))
    timed(fns, repeats)


def fewer_bytes(repeats: int) -> None:
    rng = np.random.default_rng(0)

    def pieces(a):  # 64-column panels in pieces of <= 1 MB
        c, d = a.shape
        p = a.reshape(c, d // 64, 64).transpose(1, 0, 2).copy()
        per = max(1, (1 << 20) // (c * 64 * 4))
        return [p[i:i + per] for i in range(0, len(p), per)]

    f32 = [pieces(rng.standard_normal(s, dtype=np.float32)) for s in SHAPES]
    f16 = [[p.astype(np.float16) for p in w] for w in f32]
    bf16 = [[(p.view(np.uint32) >> 16).astype(np.uint16) for p in w] for w in f32]
    i8 = [[np.clip(np.round(p * 40), -127, 127).astype(np.int8) for p in w] for w in f32]
    scale = np.float32(1 / 40)
    x = [np.ascontiguousarray(np.broadcast_to(rng.standard_normal(s[0], dtype=np.float32), (2, s[0])))
         for s in SHAPES]

    def from_bf16(p):
        u = p.astype(np.uint32)
        u <<= 16
        return u.view(np.float32)

    def run(weights, widen, scaled=False):
        def go():
            for w, xi in zip(weights, x):
                for p in w:
                    out = np.matmul(xi, widen(p))
                    if scaled:
                        out *= scale
        return go

    timed({"bare read of the float32 bytes": lambda: [np.dot(v, v) for w in f32 for v in (p.reshape(-1) for p in w)],
           "float32 panels, one row as two": run(f32, lambda p: p),
           "float16, converted per piece": run(f16, lambda p: p.astype(np.float32)),
           "bfloat16 (bit shift), converted per piece": run(bf16, from_bf16),
           "int8 + per-column scale, converted per piece": run(i8, lambda p: p.astype(np.float32), scaled=True)},
          repeats)


def threads_child() -> None:
    from engine.kv.cache import KVCacheManager
    from engine.model.checkpoint import load_checkpoint, load_config
    from engine.model.fetched import LazyModel, model_dir
    from engine.model.llama import Model, forward

    out = {}
    models = {name: (lambda n=name: Model(*load_checkpoint(ROOT / "models" / n)[:2])) for name in ("draft", "target-mha")}
    path = model_dir("smollm2-135m")
    models["smollm2-135m"] = lambda: LazyModel(path, load_config(path)).load()
    for name, build in models.items():
        model = build()
        ctx, inner = (256, 1) if name.startswith("smollm2") else (100, 20)
        tokens = np.random.default_rng(0).integers(2, model.cfg.vocab_size, ctx + 10)
        mgr = KVCacheManager(model.cfg, num_blocks=2 * (ctx // 16 + 3), block_size=16, enable_prefix_caching=False)
        seq = mgr.new_sequence()
        forward(model, tokens[:ctx], 0, mgr.append_slots(seq, tokens[:ctx]))
        r = {}
        for n in (1, 5):
            ts = []
            for _ in range(9):
                t = time.perf_counter()
                for _ in range(inner):
                    forward(model, tokens[ctx:ctx + n], ctx, mgr.append_slots(seq, tokens[ctx:ctx + n]))
                    mgr.truncate(seq, ctx)
                ts.append((time.perf_counter() - t) / inner * 1e3)
            r[f"{n} row{'s' if n > 1 else ''}"] = statistics.median(ts)
        t = time.perf_counter()
        fresh = mgr.new_sequence()
        forward(model, tokens[:ctx], 0, mgr.append_slots(fresh, tokens[:ctx]))
        r[f"prefill {ctx}"] = (time.perf_counter() - t) * 1e3
        out[name] = r
    print(json.dumps(out))


def threads(rounds: int) -> None:
    runs = {1: [], 2: []}
    for _ in range(rounds):
        for n in runs:
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(n), "OMP_NUM_THREADS": str(n)}
            done = subprocess.run([sys.executable, __file__, "threads-child"], env=env, capture_output=True,
                                  text=True, check=True)
            runs[n].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for model in runs[1][0]:
        for what in runs[1][0][model]:
            one = [r[model][what] for r in runs[1]]
            two = [r[model][what] for r in runs[2]]
            print(f"{model:13s} {what:12s} 1 thread " + " ".join(f"{v:8.2f}" for v in one)
                  + "   2 threads " + " ".join(f"{v:8.2f}" for v in two) + " ms")


def panel_widths(repeats: int) -> None:
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    x = [rng.standard_normal(s[0], dtype=np.float32) for s in SHAPES]
    flat = [a.reshape(-1) for a in w]
    fns = {"bare read (BLAS dot of each array with itself)": lambda: [np.dot(v, v) for v in flat]}
    for columns in (32, 48, 64, 96, 128):
        panels = [PanelWeight(a, columns) for a in w]
        fns[f"{columns}-column panels, as two rows"] = lambda p=panels: [lw.vec(xi) for lw, xi in zip(p, x)]
    panels = [PanelWeight(a) for a in w]
    for r in (2, 3, 4):
        def stacked(r=r):   # r panels [r C, 64] at a time; row j of the block-diagonal row meets panel j
            for lw, xi in zip(panels, x):
                p, c, b = lw.panels.shape
                rr = r if p % r == 0 else 1
                rows = np.zeros((rr, rr, c), np.float32)
                rows[np.arange(rr), np.arange(rr)] = xi
                np.matmul(rows.reshape(rr, rr * c), lw.panels.reshape(p // rr, rr * c, b))
        fns[f"64-column panels, {r} stacked, block-diagonal row"] = stacked
    timed(fns, repeats)


def variance(rounds: int) -> None:
    from cli.bench.smollm2 import CONTEXT
    from engine.kv.cache import KVCacheManager
    from engine.model.fetched import fetched_models
    from engine.model.layout import WeightStream, weights_of
    from engine.model.llama import forward
    from engine.serving.registry import ModelRegistry
    model = ModelRegistry(fetched_models()).get("smollm2-135m").model
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, CONTEXT + 1)
    mgr = KVCacheManager(model.cfg, num_blocks=CONTEXT // 16 + 2, block_size=16, enable_prefix_caching=False)
    seq = mgr.new_sequence()
    forward(model, tokens[:CONTEXT], 0, mgr.append_slots(seq, tokens[:CONTEXT]))
    products = [(w, np.ones((1, w.shape[0]), np.float32)) for w in weights_of(model)]
    probe_panel, probe_x = PanelWeight(np.ones((576, 64), np.float32)), np.ones(576, np.float32)

    def step():
        forward(model, tokens[CONTEXT:], CONTEXT, mgr.append_slots(seq, tokens[CONTEXT:]))
        mgr.truncate(seq, CONTEXT)
    fns = {"read": WeightStream(model).read, "products": lambda: [model.dot(x, w) for w, x in products],
           "step": step, "probe": lambda: [probe_panel.vec(probe_x) for _ in products for _ in range(26)]}
    ms = timed(fns, rounds, clock=time.perf_counter, show=False)
    for k, v in ms.items():
        print(f"{k:9s} min / median / p90: " + " / ".join(f"{np.percentile(v, q):.1f}" for q in (0, 50, 90)) + " ms")
    for k in ("products", "step"):
        r = np.array(ms[k]) / np.array(ms["read"])
        print(f"{k} / read, per round: p10 / median / p90 " + " / ".join(f"{np.percentile(r, q):.2f}" for q in (10, 50, 90)))


CORETYPES = ["", "Haswell", "Zen", "SkylakeX", "Cooperlake", "Sandybridge"]     # "": OpenBLAS's own choice


def coretypes_child(repeats: int) -> None:
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    x = [rng.standard_normal(s[0], dtype=np.float32) for s in SHAPES]
    flat, out_in, panels = [a.reshape(-1) for a in w], [np.ascontiguousarray(a.T) for a in w], [PanelWeight(a) for a in w]
    ms = timed({"bare read": lambda: [np.dot(v, v) for v in flat],
                "[out, in], W @ x": lambda: [a @ xi for a, xi in zip(out_in, x)],
                "[in, out], x @ W": lambda: [xi @ a for a, xi in zip(w, x)],
                "64-column panels, one row": lambda: [xi @ lw.panels for lw, xi in zip(panels, x)],
                "64-column panels, as two rows (used)": lambda: [lw.vec(xi) for lw, xi in zip(panels, x)]},
               repeats, show=False)
    print(json.dumps({k: [min(v), statistics.median(v)] for k, v in ms.items()}))


def coretypes(rounds: int, repeats: int) -> None:
    runs: dict = {c: [] for c in CORETYPES}
    core = {}
    for _ in range(rounds):
        for c in CORETYPES:
            env = {**os.environ, "OPENBLAS_CORETYPE": c, "OPENBLAS_VERBOSE": "2"}
            done = subprocess.run([sys.executable, __file__, "coretypes-child", "--repeats", str(repeats)], env=env,
                                  capture_output=True, text=True, check=True)
            lines = (done.stdout + done.stderr).splitlines()
            core[c] = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Core:")), "?")
            runs[c].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for c, rs in runs.items():
        print(f"OPENBLAS_CORETYPE={c or '(unset)'} -> kernels {core[c]}")
        for k in rs[0]:
            lo, med = min(r[k][0] for r in rs), statistics.median(r[k][1] for r in rs)
            print(f"  {k:40s} {lo:7.1f} / {med:7.1f} ms")


def pool(repeats: int) -> None:
    import ctypes
    import glob

    from engine.model import threads as T
    lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "libscipy_openblas*"))[0])
    rng = np.random.default_rng(0)
    w = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    x = [rng.standard_normal(s[0], dtype=np.float32) for s in SHAPES]
    layouts = {"out_in": [OutInWeight(a) for a in w], "panels": [PanelWeight(a) for a in w]}
    flat = [a.reshape(-1) for a in w]
    chunk_sizes = (1 << 20, 4 << 20, 16 << 20, 1 << 40)  # 1, 4, 16 MB, one chunk per thread
    default = T.CHUNK_BYTES

    def products(weights):
        return lambda: [T.vec_product(xi, lw) for lw, xi in zip(weights, x)]

    def with_pool(threads_, chunk, fn, share=True):
        def go():
            T.CHUNK_BYTES = chunk
            with T.using_threads(threads_) as p:
                p.share = share if threads_ > 1 else None
                fn()
                p.share = None
            T.CHUNK_BYTES = default
        return go

    def openblas2(fn):
        def go():
            lib.scipy_openblas_set_num_threads64_(2)
            fn()
            lib.scipy_openblas_set_num_threads64_(1)
        return go

    fns = {"read, 1 thread": with_pool(1, default, lambda: T.read_chunked(flat, T.pool())),
           "read, 2 threads (pool)": with_pool(2, default, lambda: T.read_chunked(flat, T.pool()))}
    for name, weights in layouts.items():
        fns[f"{name}: 1 thread"] = with_pool(1, default, products(weights))
        for chunk in chunk_sizes:
            label = "a chunk per thread" if chunk > 1 << 30 else f"{chunk >> 20} MB chunks"
            fns[f"{name}: pool of 2, {label}"] = with_pool(2, chunk, products(weights))
        fns[f"{name}: pool of 2, each shape as measured faster"] = with_pool(2, default, products(weights), None)
        if name == "out_in":
            fns[f"{name}: OpenBLAS 2 threads"] = openblas2(products(weights))
    with open("/proc/stat") as f:
        before = [int(v) for v in f.readline().split()[1:]]
    own, t0 = os.times(), time.perf_counter()
    timed(fns, repeats, clock=time.perf_counter)
    with open("/proc/stat") as f:
        after = [int(v) for v in f.readline().split()[1:]]
    busy = (sum(after) - sum(before) - (after[3] + after[4] - before[3] - before[4])) / os.sysconf("SC_CLK_TCK")
    mine = sum(os.times()[:2]) - sum(own[:2])
    print(f"other processes: {(busy - mine) / (time.perf_counter() - t0):.2f} cores busy meanwhile; "
          f"late helper shares taken over: {getattr(T.set_threads(2).processes(), 'taken_over', 0)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["layouts", "bytes", "threads", "threads-child", "panels", "variance",
                                      "coretypes", "coretypes-child", "pool"])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    {"layouts": lambda: layouts(a.repeats), "bytes": lambda: fewer_bytes(a.repeats),
     "threads": lambda: threads(a.rounds), "threads-child": threads_child,
     "panels": lambda: panel_widths(a.repeats), "variance": lambda: variance(a.rounds),
     "coretypes": lambda: coretypes(a.rounds, a.repeats), "coretypes-child": lambda: coretypes_child(a.repeats),
     "pool": lambda: pool(a.repeats)}[a.what]()


if __name__ == "__main__":
    main()
