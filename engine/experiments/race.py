"""A race: the same prompt with one setting apart, and a one-line verdict of what it changed.

    race(engine, prompt, settings, setting, (a, b)) -> each side's median run (engine/experiments/traces.py's
                                                       `trace`), their figures, and the verdict on b against a

The sides are timed by the one comparison method (engine/experiments/compare.py: interleaved, repeated, on the
runs' engine clocks); each lane shows the side's median run. The figures are the engine's: KV bytes per token
from the cache's formula (engine/kv/dtypes.py, as the run's summary reports it), ms per token the median of
the side's runs, the speed-up the comparison's median, spread and verdict.
"""
from __future__ import annotations

from typing import Callable

from ..external.engine_race import SETTING as ENGINE_RACE
from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.request_fit import model_defaults
from ..serving.settings import MAX_DRAFT_TOKENS, METHODS, TREE_METHODS, GenerationSettings, SettingsError
from .compare import comparison_steps

# The settings a race can set apart, each with the pair it starts from.
RACE_SETTINGS = {
    "method": ("none", "draft_model"),
    "kv_cache": (True, False),
    "num_kv_heads": (None, 1),          # the model's most KV heads against its fewest (`default_values`)
    "kv_cache_dtype": ("auto", "int8_per_token_head"),
    "num_speculative_tokens": (2, 6),
    "speculative_eagle_topk": (1, 4),   # a chain against a token tree, of the same drafter and depth
    "speculative_num_draft_tokens": (4, 8),   # a token tree's budget, at the page's top-k (TREE_TOPK for a chain)
}
TREE_RACES = ("speculative_eagle_topk", "speculative_num_draft_tokens")
RACE_GAMMAS = (1, 2, 3, 4, 6, 8, 12, 16)
RACE_TOPKS = (1, 2, 3, 4, 8)
RACE_BUDGETS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
TREE_TOPK = 4            # a tree's top-k where the page sets a chain: SGLang's EAGLE-2 examples'
# A tree's budget where the page names none (the Race's and the Shoot-out's tree): EAGLE-2's size of tree on a
# CPU, where the verification rows of a few nodes cost about as much as one (docs/benchmarks.md, `bench smollm2`)
TREE_BUDGET = 8
RACE_DTYPES = ("auto", "float16", "bfloat16", "int8_per_token_head", "fp8_e4m3", "fp8_e5m2")
METHOD_NAMES = {"none": "plain decoding", "draft_model": "draft model", "ngram": "n-gram lookup", "eagle": "EAGLE head",
                "medusa": "Medusa heads"}
DTYPE_NAMES = {"auto": "float32", "int8_per_token_head": "int8", "fp8_e4m3": "fp8 (e4m3)", "fp8_e5m2": "fp8 (e5m2)"}


def attention_name(num_attention_heads: int, num_kv_heads: int) -> str:
    kind = "MHA" if num_kv_heads == num_attention_heads else "MQA" if num_kv_heads == 1 else "GQA"
    return f"{kind} ({num_kv_heads} KV head{'s' if num_kv_heads != 1 else ''})"


def value_label(setting: str, value, num_attention_heads: int | None = None) -> str:
    """How a race names one side: 'MQA (1 KV head)', 'KV cache off', 'int8', 'γ = 6', 'draft model'."""
    if setting == "method":
        return METHOD_NAMES.get(value, str(value))
    if setting == "kv_cache":
        return "KV cache on" if value else "KV cache off"
    if setting == "num_kv_heads":
        return attention_name(num_attention_heads, value) if num_attention_heads else f"{value} KV heads"
    if setting == "kv_cache_dtype":
        return f"{DTYPE_NAMES.get(value, value)} cache"
    if setting == "num_speculative_tokens":
        return f"γ = {value}"
    if setting == "speculative_eagle_topk":
        return "chain" if value == 1 else f"top-{value} tree"
    if setting == "speculative_num_draft_tokens":
        return f"{value} nodes"
    raise SettingsError("race", f"one of {', '.join(RACE_SETTINGS)}, got {setting!r}")


def race_methods(registry, target) -> list[str]:
    """The methods a target can run: a draft model only where one shares its vocabulary, a head only where
    one is trained for it (loads nothing)."""
    heads = target.meta.get("heads", [])
    return [m for m in METHODS if m in ("none", "ngram") or m in heads
            or (m == "draft_model" and registry.draft_for(target) is not None)]


def race_choices(registry, target) -> dict[str, list[tuple[str, str]]]:
    """Each race setting's values for a target model (as form values, with their labels); loads nothing."""
    heads = target.cfg.num_attention_heads
    form = {True: "true", False: "false"}
    return {
        "method": [(m, value_label("method", m)) for m in race_methods(registry, target)],
        "kv_cache": [(form[v], value_label("kv_cache", v)) for v in (True, False)],
        "num_kv_heads": [(str(n), value_label("num_kv_heads", n, heads))
                         for n in sorted(registry.variants(target), reverse=True)],
        "kv_cache_dtype": [(d, value_label("kv_cache_dtype", d)) for d in RACE_DTYPES],
        "num_speculative_tokens": [(str(g), value_label("num_speculative_tokens", g)) for g in RACE_GAMMAS],
        "speculative_eagle_topk": [(str(k), value_label("speculative_eagle_topk", k)) for k in RACE_TOPKS],
        "speculative_num_draft_tokens": [(str(n), value_label("speculative_num_draft_tokens", n)) for n in RACE_BUDGETS],
    }


def default_values(registry, target, setting: str) -> tuple:
    """The pair a race of `setting` starts from, for a target model (loads nothing)."""
    if setting == "num_kv_heads":
        heads = registry.variants(target)
        return max(heads), min(heads)           # the same when the model has no other variant: no race
    if setting == "method":     # the drafter a request that names none gets on this model
        return "none", model_defaults(registry, target)["method"]
    return RACE_SETTINGS[setting]


def form_text(value) -> str:
    """A setting value as a form field holds it."""
    return "" if value is None else ("true" if value else "false") if isinstance(value, bool) else str(value)


def race_values(engine: InferenceEngine, settings: dict, setting: str, values) -> tuple:
    """The pair as setting values (validated); the default pair for `setting` when `values` is None."""
    if setting not in RACE_SETTINGS:
        raise SettingsError("race", f"one of {', '.join([*RACE_SETTINGS, ENGINE_RACE])}, got {setting!r}")
    if values is None:
        values = default_values(engine.registry, engine.registry.get(settings.get("model")), setting)
    parsed = tuple(getattr(GenerationSettings.parse({**settings, setting: v}), setting) for v in values)
    if len(parsed) != 2 or parsed[0] == parsed[1]:
        raise SettingsError("race", f"two different values of {setting}, got {', '.join(map(str, values))}")
    return parsed


def tree_method(registry, target) -> str:
    """The drafter a race of chain against tree uses where the page's method drafts no tree: the target's EAGLE
    head, else its Medusa heads, else n-gram lookup (loads nothing)."""
    heads = target.meta.get("heads", [])
    return next(m for m in ("eagle", "medusa") if m in heads) if {"eagle", "medusa"} & set(heads) else "ngram"


def tree_budget(s: dict) -> int:
    """A tree's budget for settings `s`: its own speculative_num_draft_tokens, else TREE_BUDGET nodes (at least
    the depth, num_speculative_tokens)."""
    return s["speculative_num_draft_tokens"] or min(MAX_DRAFT_TOKENS, max(TREE_BUDGET, s["num_speculative_tokens"]))


def shape_label(s: dict) -> str:
    """A side of a race of draft shapes (TREE_RACES), as its run's settings `s` drew: 'chain (γ = 3)',
    'top-4 tree (8 nodes, depth 3)'."""
    if s["speculative_eagle_topk"] == 1:
        return f"chain (γ = {s['num_speculative_tokens']})"
    return (f"top-{s['speculative_eagle_topk']} tree ({s['speculative_num_draft_tokens']} nodes, "
            f"depth {s['num_speculative_tokens']})")


def lane_figures(side: dict) -> dict:
    """One side's figures (a side of engine/experiments/compare.py): the median engine ms per emitted token of its
    runs, and of its median run KV bytes per token (0 without a cache) and acceptance."""
    summary = side["run"]["summary"] or {}
    return {"ms_per_token": side["median_ms_per_token"],
            "kv_bytes_per_token": (summary.get("kv_cache") or {}).get("bytes_per_token"),
            "acceptance_rate": summary.get("acceptance_rate"),
            "mean_acceptance_length": summary.get("mean_acceptance_length")}


def ratio_phrase(a: float | None, b: float | None, fewer: str, more: str) -> str | None:
    """'2.6× fewer KV bytes/token' for b against a (None when either is missing or they are equal)."""
    if not a or not b or a == b:
        return None
    return f"{a / b:.1f}× {fewer}" if b < a else f"{b / a:.1f}× {more}"


def verdict(label_b: str, fa: dict, fb: dict, speed: dict, per_forward: bool = False) -> dict:
    """The one-line verdict on side b against side a, and the ratios it quotes (b against a); `speed` is the
    comparison's speed-up of b (engine/experiments/compare.py). per_forward: quote the tokens per target forward
    (mean acceptance length), not the acceptance rate: a tree's rate counts every node drafted, off the path too."""
    parts = []
    kv_a, kv_b = fa["kv_bytes_per_token"], fb["kv_bytes_per_token"]
    if kv_b == 0 and kv_a:
        parts.append("no KV cache held (every step recomputes the whole sequence)")
    elif kv_a == 0 and kv_b:
        parts.append(f"holds {kv_b:,} KV bytes/token instead of recomputing")
    else:
        parts.append(ratio_phrase(kv_a, kv_b, "fewer KV bytes/token", "more KV bytes/token"))
    parts.append(f"engine time per token {speed['text']}")
    if per_forward and fa["mean_acceptance_length"] is not None and fb["mean_acceptance_length"] is not None:
        parts.append(f"tokens per target forward {fa['mean_acceptance_length']:.2f} → "
                     f"{fb['mean_acceptance_length']:.2f}")
    elif fa["acceptance_rate"] is not None and fb["acceptance_rate"] is not None:
        before, after = f"{fa['acceptance_rate']:.2f}", f"{fb['acceptance_rate']:.2f}"
        parts.append(f"acceptance {before} → {after}" if before != after else None)
    elif fb["mean_acceptance_length"] is not None and fa["mean_acceptance_length"] is None:
        parts.append(f"{fb['mean_acceptance_length']:.2f} tokens per target step")
    parts = [p for p in parts if p]
    kv = kv_a / kv_b if kv_a and kv_b else None
    return {"text": f"{label_b}: {', '.join(parts)}.", "speedup": speed["median"], "low": speed["low"],
            "high": speed["high"], "speed_verdict": speed["verdict"], "kv_ratio": kv}


def race(engine: InferenceEngine, prompt: str, settings: dict, setting: str = "method", values=None,
         repeats: int | None = None, run_ms: Callable[[dict], float | None] | None = None) -> dict:
    return run_to_end(race_steps(engine, prompt, settings, setting, values, repeats, run_ms))


def race_steps(engine: InferenceEngine, prompt: str, settings: dict, setting: str = "method",
               values=None, repeats: int | None = None,
               run_ms: Callable[[dict], float | None] | None = None) -> Job[dict]:
    """The prompt run with `setting` = values[0] (side a) and = values[1] (side b), all else the same.

    A race of γ needs something to propose: with method "none" it uses the draft model (or n-gram lookup). A race
    of draft shapes (TREE_RACES) needs a drafter that drafts trees (`tree_method`). Chain against tree
    (`speculative_eagle_topk`) takes the page's budget, else `tree_budget`'s: the chain side ignores it, so the
    sides differ in the tree's width alone; a race of budgets takes the page's top-k, TREE_TOPK where it is 1.
    Greedy runs that differ only in how they compute (KV cache, speculative decoding) write the same text.
    Bad settings raise here, when the job is made, not once it has its turn. run_ms: as the comparison's
    (engine/experiments/compare.py), for a test that controls the timing it checks."""
    s = GenerationSettings.parse({k: v for k, v in settings.items() if k != "fault"}).model_dump()
    if setting == "num_speculative_tokens" and s["method"] == "none":
        target = engine.registry.get(s["model"])
        s["method"] = "draft_model" if engine.registry.draft_for(target) is not None else "ngram"
    if setting in TREE_RACES and s["method"] not in TREE_METHODS:
        s["method"] = tree_method(engine.registry, engine.registry.get(s["model"]))
    if setting == "speculative_eagle_topk":
        s["speculative_num_draft_tokens"] = tree_budget(s)
    elif setting == "speculative_num_draft_tokens" and s["speculative_eagle_topk"] == 1:
        s["speculative_eagle_topk"] = TREE_TOPK
    a, b = race_values(engine, s, setting, values)
    comparison = comparison_steps(engine, prompt, {"a": {**s, setting: a}, "b": {**s, setting: b}}, repeats,
                                  run_ms=run_ms)
    return _race_runs(s, setting, (a, b), comparison)


def _race_runs(s: dict, setting: str, pair: tuple, comparison: Job[dict]) -> Job[dict]:
    c = yield from comparison
    sides = [c["sides"]["a"], c["sides"]["b"]]
    runs = [side["run"] for side in sides]
    heads = runs[0]["summary"]["model"]["num_attention_heads"] if runs[0]["summary"] else None
    lanes = []
    for role, value, side in zip(("a", "b"), pair, sides):
        run = side["run"]
        if setting == "num_kv_heads" and value is None:
            value = run["summary"]["model"]["num_key_value_heads"] if run["summary"] else value
        label = shape_label(run["settings"]) if setting in TREE_RACES else value_label(setting, value, heads)
        lanes.append({"role": role, "value": value, "label": label, "run": run, "figures": lane_figures(side)})
    return {"setting": setting, "settings": s, "lanes": lanes, "repeats": c["repeats"],
            "verdict": verdict(lanes[1]["label"], lanes[0]["figures"], lanes[1]["figures"], sides[1]["speedup"],
                               per_forward=setting in TREE_RACES),
            "same_text": runs[0]["emitted_ids"] == runs[1]["emitted_ids"],
            "finish_ms": max(r["elapsed_ms"] for r in runs)}
