"""`decoding-playground bench engine`: the first seed article's measurements on a model whose timing does not depend
on its weights, each a ratio of two functions taking turns in one run, and the speculative sweep (cli/bench/spec.py).
"""
from __future__ import annotations

import statistics

import numpy as np

from cli.bench import spec as bench_spec
from cli.bench.lib import add_bench, forward_after, goals, paired, pooled, shown, table, take_turns, timer
from engine.kv.cache import KVCacheManager
from engine.kv.store import KVStore
from engine.kv.dtypes import KV_CACHE_DTYPES, kv_bytes_per_token
from engine.model import reference
from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model, attention, forward, forward_batch, forward_no_cache
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry

TARGETS = {  # the goals, as ratios in one run
    "cache_speedup_T511": 100.0, "prefill_speedup_256": 5.0, "prefix_reuse_speedup": 6.0,
    "mqa_attention_speedup": 3.5, "lean_vs_reference_decode": 5.0,
    "draft_model_best_gamma_speedup": 1.2, "ngram_repeating_speedup": 1.5,
}


def interleaved(fns: dict, repeats: int, runs: dict | None = None, warm: int = 1, abba: bool = True) -> dict:
    """Each function's ms a turn: `warm` untimed calls (caches warm), then `runs[name]` (default 1) timed."""
    return take_turns({k: timer(fn, (runs or {}).get(k, 1), warm) for k, fn in fns.items()}, repeats, abba)


def medians(turns: dict) -> dict:
    return {k: statistics.median(pooled(v)) for k, v in turns.items()}


def pair(what: str, first, second, repeats: int, runs: int = 1, per: int = 1) -> dict:
    """Two functions taking turns: the median ms of each (per inner call) and the second's speed-up."""
    r = interleaved({"first": first, "second": second}, repeats, {"second": runs})
    ms = medians(r)
    return {"what": what, "first_ms": ms["first"] / per, "second_ms": ms["second"] / per,
            "speedup": paired(*([statistics.median(turn) for turn in v] for v in r.values()))}


def pairs(cfg: ModelConfig, quick: bool) -> list[dict]:
    """The seed's ratios: KV cache / recomputation, lean / reference decode, prefill / one by one, prefix reuse."""
    weights, n = init_weights(cfg, seed=0, std=0.05), 5 if quick else 15
    model = Model(cfg, weights)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.max_position_embeddings)
    out = [pair(f"decode at T = {T}: no cache / KV cache", lambda T=T: forward_no_cache(model, tokens[:T]),
                forward_after(model, tokens, T - 1), n, runs=20) for T in (16, 32, 64, 128, 256, 511)]
    step = forward_after(model, tokens, 127)
    dense = reference.DenseKVCache(cfg)
    reference.forward(cfg, weights, tokens[:127], dense)

    def ref():
        for _ in range(10):
            reference.forward(cfg, weights, tokens[127:128], dense)
            dense.n = 127
    out.append(pair("decode step at T = 128: reference / lean", ref, lambda: [step() for _ in range(10)], n, per=10))
    for size in (64, 256):
        mgr = KVCacheManager(cfg, num_blocks=size // 16 + 1, block_size=16)

        def prefill(one_by_one: bool, size=size, mgr=mgr):
            seq = mgr.new_sequence()
            for i, j in ([(i, i + 1) for i in range(size)] if one_by_one else [(0, size)]):
                forward(model, tokens[i:j], i, mgr.append_slots(seq, tokens[i:j]))
            mgr.free(seq)
        out.append(pair(f"{size} tokens: one by one / prefill", lambda p=prefill: p(True), lambda p=prefill: p(False),
                        3 if quick else 9))
    return out + [prefix_reuse(model, n)]


def prefix_reuse(model: Model, repeats: int) -> dict:
    """384 shared tokens + 64 new ones: recompute all 448, or hit the prefix cache and compute 64."""
    rng = np.random.default_rng(3)
    prefix, suffix = rng.integers(0, model.cfg.vocab_size, 384), rng.integers(0, model.cfg.vocab_size, 64)
    prompt = np.concatenate([prefix, suffix])
    mgr = KVCacheManager(model.cfg, num_blocks=128, block_size=16)  # room for both without evicting the prefix
    warm = mgr.new_sequence()
    forward(model, prefix, 0, mgr.append_slots(warm, prefix))
    mgr.commit(warm)
    mgr.free(warm)
    out = {}

    def run(reuse: bool):
        seq = mgr.new_sequence()
        n = mgr.match_prefix(seq, prompt.tolist()) if reuse else 0
        out[reuse] = forward(model, prompt[n:], n, mgr.append_slots(seq, prompt[n:]))[-64:]
        mgr.free(seq)
    r = pair("prefix 384 + suffix 64: recompute / prefix-cache reuse", lambda: run(False), lambda: run(True), repeats)
    r["what"] += f" (max diff {float(np.abs(out[False] - out[True]).max()):.1e})"
    return r


def gqa_attention(quick: bool) -> list[dict]:
    """One attention decode step: 8 query heads, head dim 128, T = 4096, read through the KV store."""
    T, rng, fns, mb = 4096, np.random.default_rng(4), {}, {}
    q = rng.standard_normal((1, 8, 128)).astype(np.float32)
    for kv_heads in (8, 2, 1):
        cfg = ModelConfig(hidden_size=1024, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=kv_heads,
                          head_dim=128, vocab_size=8, max_position_embeddings=T)
        store = KVStore(cfg, T // 16, 16, KV_CACHE_DTYPES["auto"])
        store.kv[0][:] = rng.standard_normal(store.kv[0].shape)
        fns[kv_heads] = lambda store=store: attention(q, *store.read(0, slice(0, T)), T - 1)
        mb[kv_heads] = store.nbytes() / 2 ** 20
    # Steady state, as the seed's median of consecutive steps: after the MHA step has streamed its KV through
    # the shared L3, the MQA step needs some calls to return to its own speed, so each turn starts with 10 untimed
    # calls. "cold" is the first call after the other configurations ran, always in the same order: each layer of
    # a deep model reads its own KV once per step, so there the KV comes from memory.
    steady = medians(interleaved(fns, 5 if quick else 15, runs={k: 3 for k in fns}, warm=10))
    cold = medians(interleaved(fns, 11 if quick else 51, warm=0, abba=False))
    return [{"kv_heads": h, "cache_mb_fp32": mb[h], "step_ms": steady[h], "speedup_vs_mha": steady[8] / steady[h],
             "cold_step_ms": cold[h], "cold_speedup_vs_mha": cold[8] / cold[h]} for h in fns]


def batched_decode(cfg: ModelConfig, quick: bool, batch: int = 64) -> dict:
    """One decode step for `batch` sequences (contexts 20-120): one by one vs one batched computation."""
    model, rng = Model(cfg, init_weights(cfg, seed=0, std=0.05)), np.random.default_rng(5)
    mgr = KVCacheManager(cfg, num_blocks=batch * 9, block_size=16)
    seqs, new = [], [rng.integers(0, cfg.vocab_size, 1) for _ in range(batch)]
    for _ in range(batch):
        s, t = mgr.new_sequence(), rng.integers(0, cfg.vocab_size, int(rng.integers(20, 120)))
        forward(model, t, 0, mgr.append_slots(s, t))
        seqs.append(s)

    def step(batched: bool):
        reqs = [(t, s.num_tokens, mgr.append_slots(s, t)) for s, t in zip(seqs, new)]
        for r in [reqs] if batched else [[r] for r in reqs]:
            forward_batch(model, r)
        for s, (_, p0, _) in zip(seqs, reqs):
            mgr.truncate(s, p0)
    return pair(f"one decode step of {batch} sequences, `{cfg.name}`: one by one / batched", lambda: step(False),
                lambda: step(True), 3 if quick else 9)


def run_engine(quick: bool, models_dir=None) -> dict:
    cfg = ModelConfig.from_name("seed-target")
    res = {"quick": quick, "model": f"`{cfg.name}`: {cfg.num_hidden_layers} layers x width "
           f"{cfg.hidden_size} x {cfg.num_attention_heads} heads, {cfg.num_parameters():,} parameters, random weights",
           "pairs": pairs(cfg, quick)
           + [batched_decode(ModelConfig.from_name(p), quick) for p in ("seed-target", "target-mha")],
           "gqa_attention": gqa_attention(quick),
           "kv_bytes": [{"kv_cache_dtype": name, "bytes_per_token": kv_bytes_per_token(cfg, name),
                         "bytes_at_512": kv_bytes_per_token(cfg, name) * 512} for name in KV_CACHE_DTYPES]}
    try:
        registry = ModelRegistry.from_dir(models_dir or MODELS_DIR)
    except FileNotFoundError as e:
        res["speculative"] = None
        print(f"(speculative sweep skipped: {e})")
    else:
        res["speculative"] = bench_spec.sweep(InferenceEngine(registry, max_sessions=2), quick)
    by = {p["what"].split(":")[0]: p["speedup"]["median"] for p in res["pairs"]}
    measured = {"cache_speedup_T511": by["decode at T = 511"], "prefill_speedup_256": by["256 tokens"],
                "prefix_reuse_speedup": by["prefix 384 + suffix 64"],
                "mqa_attention_speedup": res["gqa_attention"][-1]["speedup_vs_mha"],
                "lean_vs_reference_decode": by["decode step at T = 128"]}
    spec = res["speculative"]
    if spec:
        greedy = next(t for t in spec["by_temperature"] if t["temperature"] == 0)["rows"]
        measured["draft_model_best_gamma_speedup"] = max(r["speedup"]["median"] for r in greedy)
        measured["ngram_repeating_speedup"] = max(x["speedup"]["median"] for x in spec["ngram"][0]["rows"])
        measured["measured_vs_curve_prediction_max_error"] = max(
            abs(r["speedup"]["median"] / r["curve_prediction"] - 1) for t in spec["by_temperature"] for r in t["rows"])
    res["targets"] = {k: [v, TARGETS.get(k, 0.10)] for k, v in measured.items()}
    return res


def tables(r: dict) -> list[str]:
    out = [f"**{r['model']}**", goals([(k, 100 * got, "<=", 100 * goal, f"{got:.1%}") if k.endswith("max_error") else
                                       (k, got, ">=", goal, f"{got:.2f}x") for k, (got, goal) in r["targets"].items()]),
           table(["pair: first / second", "first ms", "second ms", "speed-up of the second"],
                 [[p["what"], f"{p['first_ms']:.3f}", f"{p['second_ms']:.3f}", shown(p["speedup"])] for p in r["pairs"]]),
           table(["KV heads", "cache MB (1 layer, fp32)", "steady step ms", "speed-up vs MHA", "cold step ms",
                  "cold speed-up"],
                 [[g["kv_heads"], f"{g['cache_mb_fp32']:.1f}", f"{g['step_ms']:.3f}", f"{g['speedup_vs_mha']:.2f}x",
                   f"{g['cold_step_ms']:.3f}", f"{g['cold_speedup_vs_mha']:.2f}x"] for g in r["gqa_attention"]],
                 "Attention decode step, 8 query heads, head dim 128, T = 4096"),
           table(["kv_cache_dtype", "bytes/token", "bytes at 512 tokens"],
                 [[b["kv_cache_dtype"], f"{b['bytes_per_token']:,}", f"{b['bytes_at_512']:,}"] for b in r["kv_bytes"]],
                 "KV bytes")]
    return out + (bench_spec.tables(r["speculative"]) if r.get("speculative") else [])


def add_parser(bsub) -> None:
    b = add_bench(bsub, "engine", "decode, prefill, prefix reuse, GQA attention, KV bytes, the speculative sweep",
                  lambda args: run_engine(args.quick, args.models_dir), tables, quick="fewer repeats, a few seconds")
    b.add_argument("--models-dir", default=None, help="models for the speculative sweep (default: models/)")
