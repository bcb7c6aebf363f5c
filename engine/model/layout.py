"""Weight layouts for models whose weights do not fit in the CPU cache, chosen by measurement at load.

A decode step of SmolLM2-135M reads all 538 MB of its float32 weights from memory: it is memory-bound,
like a GPU, and its speed is how fast numpy streams those bytes. Which call pattern streams them fastest
depends on the CPU and on the kernels OpenBLAS picks for it, and it goes both ways from one CPU to another
(the layout each run chose: docs/benchmarks.md, `bench smollm2`):

- `OutInWeight`: W stored [out, in] (Hugging Face's own order), one row as `W @ x`, a GEMV. On some hosts it
  streams at the machine's bandwidth; with OpenBLAS's SkylakeX kernels at about half of it, while a plain
  streaming read of the same bytes runs at full speed.
- `PanelWeight`: W [in, out] as contiguous 64-column panels [P, C, 64], `x @ panel` panel by panel. With
  OpenBLAS's SkylakeX kernels one row runs as two (the row and a row of zeros), which its small-matrix GEMM
  streams close to the streaming read; with its Haswell kernels (AMD Zen 3) a two-row product packs every
  panel and runs far slower than the read, and one row as a GEMV a panel runs at the read's speed; there a few
  rows cost less as a GEMV each, a panel at a time, the panel still in cache for the next row. Which row counts
  run padded, and which row by row, is measured at load (`pad_rows`).

`use_fastest_layout(model)` times one row and a verification's 6 rows through both layouts of the model's LM
head (113 MB, larger than every cache) and stores all matrices in the faster one: one copy of the weights. A
layout can win one row and lose six, which would make every verification dearer than the decode step it saves:
so the sum of both decides.

A forward over a few rows (speculative verification) must read every weight once for all rows, not once
per row. OpenBLAS's GEMM on a whole large matrix packs all of it first, so each layout multiplies few rows
piece by piece, each piece reused from the cache for every row; the pattern is chosen per call from the
number of rows n:

    layout     n = 1                 2 <= n <= 9                          n > 9 (prefill)
    panels     x @ panel, or as two  X @ panel, panel by panel (padded    the same
               rows (`pad_rows`)     to more rows, or x_j @ panel for
                                     each row, where that is faster)
    out_in     W @ x (GEMV)          block @ x_j for each row, blocks     X @ block.T, a GEMM a block
                                     of 256 rows still in cache           of 256 rows
"""
from __future__ import annotations

import time

import numpy as np

from .llama import matmul_rows
from .threads import chunk_edges, rows_product, vec_product

PANEL_COLUMNS = 64
BLOCK_ROWS = 256
FEW_ROWS = 9
VERIFY_ROWS = 6          # a round's verification at the page's γ of 5: what a layout is also chosen by
PAD_GAIN = 0.95          # more rows must take at most this share of the time of fewer (`pad_rows`)


class PanelWeight:
    """A [C, D] weight of `x @ W` as D/b contiguous column panels [D/b, C, b]."""
    # row count -> the larger count its products run as (zero rows added): OpenBLAS has fast kernels for some row
    # counts and not others, and one row may stream faster as a GEMV or as two rows. A property of this CPU's BLAS
    # kernels, so one for the process, measured when a model first takes this layout (`pad_rows`) and kept: the
    # padding changes a product's last bits, so a later measurement would change the floats of models loaded before
    padded_rows: dict[int, int] = {1: 2}
    measured = False
    # row counts whose products run as one GEMV per row, panel by panel, each panel still in cache for the next row:
    # where OpenBLAS's GEMM of a few rows costs far more than a GEMV (it packs every panel before multiplying), a
    # few GEMVs cost less (each row's floats are its own GEMV's). Measured with `padded_rows` (`pad_rows`)
    row_by_row: frozenset = frozenset()

    def __init__(self, w, columns: int = PANEL_COLUMNS):  # w [C, D]
        c, d = w.shape
        b = columns if d % columns == 0 else d          # a width that does not divide: one panel
        self.shape, self.dtype = (c, d), w.dtype
        self.panels = np.ascontiguousarray(w.reshape(c, d // b, b).transpose(1, 0, 2))   # [P, C, b]

    @property
    def data(self):  # the stored array
        return self.panels

    @data.setter
    def data(self, array):
        self.panels = array

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes

    def vec(self, x, pool=None):  # [C] -> [D]
        return self.rows(x[None], pool)[0]

    def rows(self, x, pool=None):  # [n, C] -> [n, D], each panel's product written straight into its columns
        n, num_panels = x.shape[0], self.panels.shape[0]
        if n in self.row_by_row:
            return self.rows_one_by_one(x, pool)
        padded = self.padded_rows.get(n, n)
        if padded > n:                               # a row count that runs faster padded here (`pad_rows`)
            x = np.concatenate([x, np.zeros((padded - n, x.shape[1]), x.dtype)])
        out = np.empty((padded, self.shape[1]), np.result_type(x, self.panels))
        view = out.reshape(padded, num_panels, -1).transpose(1, 0, 2)              # [P, rows, b]
        if pool is not None and pool.few_rows(self.panels, x, view):              # helper processes took it
            return out[:n]

        def whole():
            np.matmul(x, self.panels, out=view)
            return out[:n]

        def chunks():
            edges = chunk_edges(num_panels, self.panels[0].nbytes, 1, pool.threads)   # runs of whole panels
            return [lambda a=a, b=b: np.matmul(x, self.panels[a:b]) for a, b in zip(edges, edges[1:])]

        def assemble(parts):
            np.concatenate(parts, out=view)
            return out[:n]
        if pool is None:
            return whole()
        return assemble(pool.run(chunks()))

    def rows_one_by_one(self, x, pool=None):  # [n, C] -> [n, D]: `row_by_row`'s pattern
        """One numpy call a run of panels: x [1, n, 1, C] @ panels [P, 1, C, b] -> [P, n, 1, b] loops over the
        panels outside and the rows inside, a GEMV each (a [1, C] row times a [C, b] panel)."""
        n, num_panels = x.shape[0], self.panels.shape[0]
        rows = x[None, :, None, :]

        def chunk(a, b):                             # panels a..b -> [b - a, n, 1, cols]
            return np.matmul(rows, self.panels[a:b, None])
        if pool is None:
            parts = [chunk(0, num_panels)]
        else:                                        # threads only: the helper processes run padded GEMMs
            edges = chunk_edges(num_panels, self.panels[0].nbytes, 1, pool.threads)
            parts = pool.run([lambda a=a, b=b: chunk(a, b) for a, b in zip(edges, edges[1:])])
        out = np.empty((n, self.shape[1]), np.result_type(x, self.panels))
        np.concatenate(parts, out=out.reshape(n, num_panels, 1, -1).transpose(1, 0, 2, 3))
        return out

    def to_array(self):  # -> [C, D]
        return self.panels.transpose(1, 0, 2).reshape(self.shape)


class OutInWeight:
    """A [C, D] weight of `x @ W`, stored as W.T [D, C]; a few rows are multiplied block by block of rows."""

    def __init__(self, w, block_rows: int = BLOCK_ROWS):  # w [C, D]
        c, d = w.shape
        self.shape, self.dtype = (c, d), w.dtype
        self.t = np.ascontiguousarray(w.T)                                        # [D, C]
        self.block_rows = min(block_rows, d)

    @property
    def data(self):  # the stored array
        return self.t

    @data.setter
    def data(self, array):
        self.t = array

    @property
    def nbytes(self) -> int:
        return self.t.nbytes

    def vec(self, x, pool=None):  # [C] -> [D]
        t = self.t
        if pool is None:
            return np.dot(t, x)
        out = np.empty((1, self.shape[1]), np.result_type(x, t))
        if pool.few_rows(t, x[None], out):                                         # helper processes took it
            return out[0]

        def chunks():
            return [lambda a=a, b=b: np.dot(t[a:b], x) for a, b in self.edges(pool)]
        return np.concatenate(pool.run(chunks()))

    def rows(self, x, pool=None):  # [n, C] -> [n, D]
        n, t = x.shape[0], self.t
        if n == 1:
            return self.vec(x[0], pool)[None]

        def whole():
            return self.columns(x, 0, self.shape[1])
        if pool is None:
            return whole()
        out = np.empty((n, self.shape[1]), np.result_type(x, t))
        if pool.few_rows(t, x, out):                                               # helper processes took it
            return out

        def chunks():
            return [lambda a=a, b=b: self.columns(x, a, b) for a, b in self.edges(pool)]
        return np.concatenate(pool.run(chunks()), axis=1)

    def columns(self, x, start: int, stop: int):  # [n, C] -> x @ W[:, start:stop], block by block of rows of W
        """A few rows: each block's GEMVs for every row while it is in cache. More (a prefill chunk): one GEMM a
        block, not one for the whole: OpenBLAS's GEMM sums in an order that can depend on the product's width
        (seen on an AMD EPYC host), and the same calls on the same blocks give every thread count the same floats
        (chunks fall on blocks: `edges`)."""
        out = np.empty((x.shape[0], stop - start), np.result_type(x, self.t))
        r, many = self.block_rows, x.shape[0] > FEW_ROWS
        for a in range(start, stop, r):
            block = self.t[a:min(a + r, stop)]
            if many:
                out[:, a - start:a - start + len(block)] = np.dot(x, block.T)
                continue
            for j in range(x.shape[0]):             # a block's GEMVs for every row while it is in cache
                np.dot(block, x[j], out=out[j, a - start:a - start + len(block)])
        return out

    def edges(self, pool) -> list[tuple[int, int]]:  # chunks of the output rows, edges on `block_rows` boundaries
        e = chunk_edges(self.shape[1], self.t[0].nbytes, self.block_rows, pool.threads)
        return list(zip(e, e[1:]))

    def to_array(self):  # -> [C, D]
        return self.t.T


LAYOUTS = {"panels": PanelWeight, "out_in": OutInWeight}
MATRICES = ("w_qkv", "w_o", "w_gate_up", "w_down")      # the matrices of an engine.model.llama.LayerWeights


# x @ a layout's weight: `Model.dot` ([n, C] -> [n, D]) of a model with these weights, and one vector's product
# ([C] -> [D], a draft head's), on the threads `engine.model.threads.set_threads` gave the process
weight_rows, weight_vec = rows_product, vec_product


def step_ms(weights: dict, repeats: int = 5) -> dict[str, float]:
    """Per layout of one [C, D] weight ({layout name: the weight in it}), the fastest ms of one row plus the
    fastest of VERIFY_ROWS rows: a decode step's product and a verification's, the two a speed-up compares. The
    layouts take turns (on a shared machine interference only adds time)."""
    first = next(iter(weights.values()))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, first.shape[0])).astype(first.dtype) for n in (1, VERIFY_ROWS)]
    times = {(name, i): [] for name in weights for i in range(len(xs))}
    for _ in range(repeats):
        for name, lw in weights.items():
            for i, x in enumerate(xs):
                t = time.perf_counter()
                lw.rows(x)
                times[name, i].append((time.perf_counter() - t) * 1e3)
    return {name: sum(min(times[name, i]) for i in range(len(xs))) for name in weights}


def weights_of(model) -> list:
    """Every matrix a forward of `model` multiplies by, in order: the bytes a decode step reads."""
    return [getattr(lw, a) for lw in model.layers for a in MATRICES] + [model.lm_head]


def weight_bytes(model) -> int:
    return sum(w.nbytes for w in weights_of(model))


class WeightStream:
    """One pass over exactly a model's weight bytes, the floor of a decode step, two ways:
    `read`, a BLAS dot of each stored array with itself (every byte loaded once, one multiply-add each), and
    `gemv`, one matrix-vector product per matrix stored [out, in] (only for a model in that layout)."""

    def __init__(self, model):
        weights = weights_of(model)
        self.flat = [w.data.reshape(-1) if hasattr(w, "data") else w.reshape(-1) for w in weights]
        self.nbytes = sum(v.nbytes for v in self.flat)
        rng = np.random.default_rng(0)
        self.products = [(w.t, rng.standard_normal(w.shape[0]).astype(w.dtype))
                         for w in weights if isinstance(w, OutInWeight)]

    def read(self) -> None:
        for v in self.flat:
            np.dot(v, v)

    def gemv(self) -> None:
        for t, x in self.products:
            np.dot(t, x)


def stream_ms(model, repeats: int = 5) -> float:
    """The fastest of `repeats` passes of `WeightStream.read` over the model's weights, in ms."""
    stream, times = WeightStream(model), []
    for _ in range(repeats):
        t = time.perf_counter()
        stream.read()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def use_layout(model, name: str):
    """Store every matrix of `model` (an engine.model.llama.Model) in layout `name`, in place; returns the model."""
    layout = LAYOUTS[name]
    for lw in model.layers:
        for attr in MATRICES:
            setattr(lw, attr, layout(getattr(lw, attr)))
    model.lm_head = layout(model.lm_head)
    pack_in_reading_order(model)
    model.layout = name
    model.split_rows = frozenset()     # the weights choose their own call pattern per row count
    model.dot = weight_rows
    return model


def pack_in_reading_order(model) -> None:
    """Move every matrix a step reads into one buffer, in the order a step reads them.

    Allocated one by one, the matrices land wherever malloc finds room, most of them in small pages; a step
    then misses the TLB on every 4 KB it streams, and its products run markedly slower than over the same
    bytes in one large, huge-page-backed allocation."""
    weights = weights_of(model)
    buffer = np.empty(sum(w.data.size for w in weights), weights[0].data.dtype)
    start = 0
    for w in weights:
        stored = buffer[start:start + w.data.size].reshape(w.data.shape)
        stored[...] = w.data
        w.data, start = stored, start + w.data.size


def pad_rows(head: PanelWeight, repeats: int = 5) -> dict[int, int]:
    """Run panel products of n rows as m > n rows where m rows through `head` (an LM head: 113 MB, beyond every
    cache) take at most PAD_GAIN of n rows' time here, or as n GEMVs a panel (`PanelWeight.row_by_row`) where
    that takes at most PAD_GAIN of the best of those. OpenBLAS's small GEMM has kernels for some row counts and
    not others (3 rows may cost more than 4), packs every panel on some hosts (2 rows then cost far more than
    one), and one row streams at about the read's speed as a GEMV on some hosts and as two rows on others
    (docs/benchmarks.md, `bench smollm2`). Sets `PanelWeight.padded_rows` and `row_by_row`; returns the padding."""
    PanelWeight.padded_rows, PanelWeight.row_by_row = {}, frozenset()
    rng = np.random.default_rng(0)
    counts = range(1, FEW_ROWS + 1)
    xs = {n: rng.standard_normal((n, head.shape[0])).astype(head.dtype) for n in counts}
    ways = {"gemm": head.rows, "gemv": head.rows_one_by_one}
    times = {(n, how): [] for n in counts for how in (ways if n > 1 else ["gemm"])}   # one row: a GEMV either way
    for _ in range(repeats):
        for n, how in times:
            t = time.perf_counter()
            ways[how](xs[n])
            times[n, how].append(time.perf_counter() - t)
    best = {key: min(v) for key, v in times.items()}
    plan, one_by_one = {}, set()
    for n in counts:
        m = min((m for m in counts if m >= n), key=lambda m: best[m, "gemm"])
        fastest = best[m, "gemm"] if best[m, "gemm"] < PAD_GAIN * best[n, "gemm"] else best[n, "gemm"]
        if n > 1 and best[n, "gemv"] < PAD_GAIN * fastest:
            one_by_one.add(n)
        elif fastest < best[n, "gemm"]:
            plan[n] = m
    PanelWeight.padded_rows, PanelWeight.row_by_row = plan, frozenset(one_by_one)
    return plan


def use_fastest_layout(model):
    """`use_layout` with the layout whose products over the LM head, one row and a verification's rows
    (`step_ms`), are faster here, the panels' row counts padded where that is faster (`pad_rows`, measured
    first so that the panels are compared at their best, by the first model of the process)."""
    heads = {name: layout(model.lm_head) for name, layout in LAYOUTS.items()}
    if not PanelWeight.measured:
        pad_rows(heads["panels"])
        PanelWeight.measured = True
    ms = step_ms(heads)
    del heads                                        # before the model's own copy: a lower peak
    use_layout(model, min(ms, key=ms.get))
    model.layout_ms = ms
    return model


def choose_split_rows(model):
    """For a model in [in, out] arrays (weights within the CPU caches: our character models): the row counts
    whose products run faster as `matmul_rows` for its shapes here, stored in `model.split_rows`. Measured
    where a model is loaded (engine/model/loaded_model.py), once per model; returns the model."""
    if model.layout == "arrays" and "split_rows" not in vars(model):
        model.split_rows = measure_split_rows(model.layers[0].w_gate_up)
    return model


def measure_split_rows(w, sizes=range(3, 17), repeats: int = 9) -> frozenset:
    """The row counts for which `matmul_rows` beats one product with this weight (medians, interleaved)."""
    rng = np.random.default_rng(0)
    faster = set()
    for n in sizes:
        x = rng.standard_normal((n, w.shape[0])).astype(np.float32)
        direct, split = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            np.dot(x, w)
            direct.append(time.perf_counter() - t)
            t = time.perf_counter()
            matmul_rows(x, w)
            split.append(time.perf_counter() - t)
        if np.median(split) < 0.9 * np.median(direct):
            faster.add(n)
    return frozenset(faster)
