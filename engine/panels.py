"""Weight matrices stored as column panels, for models whose weights do not fit in the CPU cache.

A decode step of SmolLM2-135M reads all 540 MB of its float32 weights from memory: it is memory-bound,
like a GPU. Verifying k+1 speculative tokens should then cost little more than one step, since each
weight is read once for all rows. OpenBLAS does not do that for a few rows of x @ W with a large W
(measured here: 2 rows cost 2.8x one row, 5 rows 3.1x), because its GEMM first copies ("packs") the
whole of W. Stored as panels W[:, j*b:(j+1)*b] of b = 64 columns, each 147 KB and contiguous, every
panel is one small product that fits in the cache:

    x @ W  ==  concat_j(x @ panel_j)        x [n, C], panel_j [C, b]  ->  np.matmul(x, panels) [P, n, b]

Measured on this machine over SmolLM2-135M's matrices (one BLAS thread, median ms for 1 / 2 / 5 rows):
a whole matrix 31 / 85 / 100, panels 30 / 23 / 31. A single row is run as two (the second a copy of
the first): OpenBLAS's small GEMM beats its GEMV on a [576, 64] panel (23 ms against 30 ms).

`use_panels(model)` swaps a built `engine.model.Model`'s matrices for `PanelWeight`s, which `forward`
uses unchanged: its only operation on a weight is `x @ w`, which numpy hands to
`PanelWeight.__rmatmul__` (numpy defers binary operators to an operand whose `__array_ufunc__` is None).
"""
from __future__ import annotations

import operator

import numpy as np

PANEL_COLUMNS = 64


class PanelWeight:
    """A [C, D] float32 weight as D/b contiguous column panels [D/b, C, b]; supports `x @ w` only."""
    __array_ufunc__ = None          # `x @ w` -> w.__rmatmul__(x)

    def __init__(self, w, columns: int = PANEL_COLUMNS):
        c, d = w.shape
        b = columns if d % columns == 0 else d          # a width that does not divide: one panel
        self.shape, self.dtype = (c, d), w.dtype
        self.panels = np.ascontiguousarray(w.reshape(c, d // b, b).transpose(1, 0, 2))   # [P, C, b]

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes

    def __rmatmul__(self, x):  # [n, C] -> [n, D]
        n = x.shape[0]
        if n == 1:      # see the module docstring: two rows are faster than one
            return self._product(np.concatenate([x, x]))[:1]
        return self._product(x)

    def _product(self, x):  # [n, C] -> [n, D], each panel's product written straight into its columns
        n, num_panels = x.shape[0], self.panels.shape[0]
        out = np.empty((n, self.shape[1]), np.result_type(x, self.panels))
        np.matmul(x, self.panels, out=out.reshape(n, num_panels, -1).transpose(1, 0, 2))    # [P, n, b] view
        return out

    def to_array(self):  # -> [C, D]
        return self.panels.transpose(1, 0, 2).reshape(self.shape)


def use_panels(model, columns: int = PANEL_COLUMNS):
    """Store every matrix of `model` (an engine.model.Model) as panels, in place; returns the model."""
    for lw in model.layers:
        for name in ("w_qkv", "w_o", "w_gate_up", "w_down"):
            setattr(lw, name, PanelWeight(getattr(lw, name), columns))
    model.lm_head = PanelWeight(model.lm_head, columns)
    model.split_rows = frozenset()     # panels already keep few-row products cheap (engine.model.matmul_rows)
    model.dot = operator.matmul        # x @ panels: PanelWeight.__rmatmul__ (np.dot would not call it)
    model.vector_decode = False        # PanelWeight multiplies 2-D rows only
    return model
