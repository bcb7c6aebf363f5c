"""Where a SmolLM2 decode step's time goes beyond reading the weights (`bench smollm2`'s breakdown): the fastest of
runs taking turns (interference only adds time, and the parts are subtracted from each other), no profiler (its
cost per call would swamp the small operations). Each operation outside the products runs on the model's own
shapes, in a loop of as many calls as a step makes.
"""
from __future__ import annotations

import numpy as np

from cli.bench.lib import forward_after, pooled, table, take_turns, timer
from engine.model.layout import WeightStream, weights_of
from engine.model.llama import attention, rms_norm_vector, swiglu


class ModelWith:
    """A model with some attributes replaced, the others the model's own."""

    def __init__(self, model, **replaced):
        self._model = model
        vars(self).update(replaced)

    def __getattr__(self, name):
        return getattr(self._model, name)


def step_breakdown(model, tokens, context: int, repeats: int = 9) -> dict:
    cfg = model.cfg
    layers, nq, nkv, hd = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rows = forward_after(model, tokens, context)
    rng = np.random.default_rng(0)
    products = [(w, rng.standard_normal((1, w.shape[0])).astype(np.float32)) for w in weights_of(model)]
    head, x_head = products[-1]

    def all_products():
        for w, x in products:
            model.dot(x, w)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, kv, x, y = f32(1, nq, hd), f32(2, nkv, context + 1, hd), f32(cfg.hidden_size), f32(cfg.hidden_size)
    gate_up, rotation = f32(2 * cfg.intermediate_size), model.rotation[context]
    pairs = f32((nq + nkv) * hd).view(np.complex64).reshape(nq + nkv, hd // 2)      # |rotation| = 1

    def times(n, fn):
        return lambda: [fn() for _ in range(n)]

    table_of = {}

    def looked_up(x, w):      # a product answered from a table: the step without its matrix products
        if id(w) not in table_of:
            table_of[id(w)] = model.dot(x, w)
        return table_of[id(w)].copy()

    without = ModelWith(model, dot=looked_up)
    rows(1, through=without)                           # fills the table
    parts = {"step": lambda: rows(1), "products": all_products, "without": lambda: rows(1, through=without),
             "lm_head": lambda: model.dot(x_head, head), "floor": WeightStream(model).read,
             "attention": times(layers, lambda: attention(q, kv[0], kv[1], context)),
             "rms_norm": times(2 * layers + 1, lambda: rms_norm_vector(x, model.c_eps)),
             "swiglu": times(layers, lambda: swiglu(gate_up[:cfg.intermediate_size], gate_up[cfg.intermediate_size:])),
             "rope": times(layers, lambda: np.multiply(pairs, rotation, out=pairs)),
             "residual": times(2 * layers, lambda: np.add(y, x, out=y))}
    measured = take_turns({k: timer(fn) for k, fn in parts.items()}, repeats, abba=False)
    return {k: min(pooled(v)) for k, v in measured.items()}


OPERATIONS = {"attention": "attention over the cached positions (scores, softmax, values), every layer",
              "rms_norm": "RMSNorm, 2 a layer + 1", "swiglu": "SwiGLU, 1 a layer", "rope": "RoPE, 1 a layer",
              "residual": "residual adds, 2 a layer"}


def breakdown_table(ms: dict) -> str:
    step, rest = ms["step"], ms["without"]
    rest_ops = rest - sum(ms[k] for k in OPERATIONS)
    rows = [["the whole step", ms["step"]], ["its matrix products (every weight's one-row product)", ms["products"]],
            ["of which the LM head", ms["lm_head"]], ["the floor: one bare pass over the weight bytes", ms["floor"]],
            ["everything else: the step with its products looked up in a table", rest]]
    rows += [[f"- {label}", ms[k]] for k, label in OPERATIONS.items()]
    rows.append(["- the rest: Python lines, reshapes, K/V writes, cache bookkeeping, the table's copies", rest_ops])
    return table(["part", "ms", "share of the step"], [[what, f"{v:.2f}", f"{v / step:.1%}"] for what, v in rows],
                 "Where a decode step's time goes (fastest of the turns)")
