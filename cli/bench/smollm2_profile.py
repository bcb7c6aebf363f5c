"""Where a SmolLM2 decode step's time goes beyond reading the weights (`bench smollm2`'s breakdown).

Measured at a context of 256 tokens, the fastest of interleaved runs (interference only adds time, and the
parts are subtracted from each other), no profiler (cProfile's ~1 us per call
would swamp the small operations): the whole step, its matrix products alone (every weight's one-row
product, as the step makes them), the LM head's product alone, the floor (`WeightStream.read`), the step
with its products answered from a table (everything but the products), and each operation outside the
products on the model's own shapes, in a loop of as many calls as a step makes.
"""
from __future__ import annotations

import time

import numpy as np

from engine.kv.cache import KVCacheManager
from engine.model.layout import WeightStream, weights_of
from engine.model.llama import attention, decode, forward, rms_norm_vector, swiglu


def step_breakdown(model, tokens, context: int, repeats: int = 9) -> dict:
    cfg = model.cfg
    layers, nq, nkv, hd = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    mgr = KVCacheManager(cfg, num_blocks=context // 16 + 2, block_size=16, enable_prefix_caching=False)
    seq = mgr.new_sequence()
    forward(model, tokens[:context], 0, mgr.append_slots(seq, tokens[:context]))
    new = tokens[context:context + 1]

    def step():
        forward(model, new, context, mgr.append_slots(seq, new))
        mgr.truncate(seq, context)

    rng = np.random.default_rng(0)
    products = [(w, rng.standard_normal(w.shape[0]).astype(np.float32)) for w in weights_of(model)]
    head, x_head = products[-1]

    def all_products():
        for w, x in products:
            model.vec_dot(x, w)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, kv, x, y = f32(1, nq, hd), f32(2, nkv, context + 1, hd), f32(cfg.hidden_size), f32(cfg.hidden_size)
    gate_up, rotation = f32(2 * cfg.intermediate_size), model.rotation[context]
    pairs = f32((nq + nkv) * hd).view(np.complex64).reshape(nq + nkv, hd // 2)      # |rotation| = 1

    def times(n, fn):
        return lambda: [fn() for _ in range(n)]

    table = {}

    def looked_up(x, w):      # a product answered from a table: the step without its matrix products
        if id(w) not in table:
            table[id(w)] = model.vec_dot(x, w)
        return table[id(w)].copy()

    without = ModelWith(model, vec_dot=looked_up)
    decode(without, int(new[0]), context, mgr.append_slots(seq, new))
    mgr.truncate(seq, context)

    def step_without_products():
        decode(without, int(new[0]), context, mgr.append_slots(seq, new))
        mgr.truncate(seq, context)

    parts = {"step": step, "products": all_products, "without": step_without_products, "lm_head": lambda: model.vec_dot(x_head, head),
             "floor": WeightStream(model).read,
             "attention": times(layers, lambda: attention(q, kv[0], kv[1], context)),
             "rms_norm": times(2 * layers + 1, lambda: rms_norm_vector(x, model.c_eps)),
             "swiglu": times(layers, lambda: swiglu(gate_up[:cfg.intermediate_size], gate_up[cfg.intermediate_size:])),
             "rope": times(layers, lambda: np.multiply(pairs, rotation, out=pairs)),
             "residual": times(2 * layers, lambda: np.add(y, x, out=y))}
    measured = {k: [] for k in parts}
    for _ in range(repeats):
        for k, fn in parts.items():
            t = time.perf_counter()
            fn()
            measured[k].append((time.perf_counter() - t) * 1e3)
    return {k: min(v) for k, v in measured.items()}


class ModelWith:
    """A model with some attributes replaced, the others the model's own."""

    def __init__(self, model, **replaced):
        self._model = model
        vars(self).update(replaced)

    def __getattr__(self, name):
        return getattr(self._model, name)


OPERATIONS = {"attention": "attention over the 256 cached positions (scores, softmax, values), 30 layers",
              "rms_norm": "RMSNorm, 61 calls", "swiglu": "SwiGLU, 30 calls", "rope": "RoPE, 30 calls",
              "residual": "residual adds, 60 calls"}


def breakdown_markdown(ms: dict) -> list[str]:
    rest = ms["without"]
    ops = sum(ms[k] for k in OPERATIONS)
    lines = ["", "Where a decode step's time goes (context 256, the fastest of interleaved runs, no profiler; each "
             "operation in a loop of as many calls as a step makes, on the model's shapes):", "",
             "| part | ms | share of the step |", "|---|---|---|",
             f"| the whole step | {ms['step']:.1f} | 100% |",
             f"| its matrix products (every weight's one-row product) | {ms['products']:.1f} | "
             f"{ms['products'] / ms['step']:.0%} |",
             f"| of which the LM head (113 MB) | {ms['lm_head']:.1f} | {ms['lm_head'] / ms['step']:.0%} |",
             f"| the floor: one bare pass over the weight bytes | {ms['floor']:.1f} | {ms['floor'] / ms['step']:.0%} |",
             f"| everything else: the step with its products looked up in a table | {rest:.1f} | "
             f"{rest / ms['step']:.0%} |"]
    lines += [f"| - {label} | {ms[k]:.2f} | {ms[k] / ms['step']:.1%} |" for k, label in OPERATIONS.items()]
    lines.append(f"| - the rest: Python lines, reshapes, K/V writes, cache bookkeeping, the table's copies | "
                 f"{rest - ops:.1f} | {(rest - ops) / ms['step']:.0%} |")
    return lines
