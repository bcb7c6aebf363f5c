"""Which model a request runs on, and what it gets for the settings it leaves out.

A link in a slide deck or a program names some settings and leaves the others out; the models a server has
change over the years (SmolLM2 came, and with it a default no draft model can serve). The rule
(docs/protocol.md, "Settings left out, models chosen"):

- A setting left out takes the chosen model's default (`model_defaults`), a value that model can run: the
  method is its EAGLE head where `bench heads` measured the head's best γ and confidence threshold (with
  those), else its draft model, else its EAGLE head (with EAGLE_DEFAULTS), else n-gram lookup. A method named
  brings its own defaults (`method_defaults`: suffix decoding's γ).
- A model named is the model run; a setting named that it cannot take is an error naming that setting.
- No model named: the default model, if it can take every setting named; else the first target that can,
  and a one-line note says which and why. If none can, the default model's error.
- Nothing named is changed.

The web layer (app/views/page.py, app/ws/connection.py) translates links and messages into `asked` and shows
what this decides; it decides nothing itself. Nothing here loads weights.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..model.loaded_model import LoadedModel
from ..model.threads import threads
from ..spec_decode.heads import METHODS as HEAD_METHODS
from ..spec_decode.heads import demo_settings
from .settings import GenerationSettings, SettingsError, excerpt

# An EAGLE head's drafting when it is a model's default method and `bench heads` measured none for the thread
# count (models/heads/NAME/demo.json): γ and the confidence threshold of SmolLM2's head's best one-thread run.
EAGLE_DEFAULTS = {"num_speculative_tokens": 5, "draft_confidence_threshold": 0.5}
# A tree's shape where `bench heads` measured a tree fastest: filled as a whole, for EAGLE, where a request names
# none of it (a depth asked with the demo's budget could make a tree below its depth).
TREE_SHAPE = ("speculative_eagle_topk", "speculative_num_draft_tokens")


@dataclass
class Fit:
    model: str                         # the target the request runs on
    settings: dict                     # what was asked, and the model's defaults for what was left out
    filled: dict = field(default_factory=dict)   # the defaults that differ from GenerationSettings' own
    note: str | None = None            # one line when the model is not the default one (which, and why)


def model_defaults(registry, target: LoadedModel) -> dict:
    """The settings a request that leaves them out gets on `target` where GenerationSettings' own would not run
    (or would run worse than the model's measured best): its method, and with an EAGLE head its drafting. An
    EAGLE head that `bench heads` measured comes before a draft model (SmolLM2 has both: its head drafts faster,
    docs/benchmarks.md)."""
    heads = target.meta.get("heads", [])
    # the head's best drafting as `bench heads` measured it at this process's weight-product threads
    best = demo_settings(target.name, threads(), registry.heads_dir) if "eagle" in heads else None
    if best is not None:
        return {"method": "eagle", **{k: best[k] for k in (*EAGLE_DEFAULTS, *TREE_SHAPE) if k in best}}
    if registry.draft_for(target) is not None:
        return {"method": "draft_model"}
    if "eagle" in heads:
        return {"method": "eagle", **EAGLE_DEFAULTS}
    return {"method": "ngram"}


def target_of(registry, s: GenerationSettings) -> tuple[LoadedModel, dict]:
    """The target that runs settings `s` (its KV-head variant where `num_kv_heads` is named) and the variants
    it may switch to while running; a SettingsError naming the setting it cannot take."""
    try:
        target = registry.get(s.model)
    except KeyError as e:
        raise SettingsError("model", str(e.args[0])) from None
    if target.role != "target":
        raise SettingsError("model", f"{s.model!r} is a draft model; choose a target")
    if (why := unmet(registry, target, s)) is not None:    # chat, KV heads, method
        raise why
    variants = registry.variants(target)
    return (target if s.num_kv_heads is None else variants[s.num_kv_heads]), variants


def unmet(registry, target: LoadedModel, s: GenerationSettings) -> SettingsError | None:
    """Why `target` cannot run settings `s` (the first setting it cannot take), or None. The session checks the
    same (engine/serving/session.py) when it starts; this answers before anything is loaded."""
    if s.chat and (target.tokenizer is None or target.tokenizer.chat_template is None):
        return SettingsError("chat", f"{target.name} has no chat template")
    variants = registry.variants(target)
    if s.num_kv_heads is not None:
        if s.num_kv_heads not in variants:
            note = target.meta.get("num_kv_heads_note")
            return SettingsError("num_kv_heads", f"{s.num_kv_heads} is not available for {target.name}"
                                                 f"{f' ({note})' if note else ''}; choose one of {sorted(variants)}")
        target = variants[s.num_kv_heads]
    if s.method == "draft_model" and registry.draft_for(target) is None:
        return SettingsError("method", f"no draft model shares {target.name}'s vocabulary "
                                       f"({target.cfg.vocab_size:,} tokens); use method ngram, suffix or none")
    if s.method in HEAD_METHODS and s.method not in target.meta.get("heads", []):
        return SettingsError("method", f"{target.name} has no {s.method} head")
    return None


MAX_SPECULATIVE_TOKENS = 16              # num_speculative_tokens' range's top


def method_defaults(asked: dict) -> dict:
    """What a method asked for brings where it is left out: suffix decoding drafts up to
    suffix_decoding_max_tree_depth tokens (vLLM's num_speculative_tokens for it, here at most 16), its rule
    deciding each round's length."""
    if asked.get("method") == "suffix" and asked.get("num_speculative_tokens") is None:
        depth = asked.get("suffix_decoding_max_tree_depth") or GenerationSettings().suffix_decoding_max_tree_depth
        return {"num_speculative_tokens": min(int(depth), MAX_SPECULATIVE_TOKENS)}
    return {}


def _on(registry, target: LoadedModel, asked: dict) -> tuple[dict, dict, SettingsError | None]:
    """`asked` on `target`: the settings with its defaults filled in, those defaults, and what it cannot take."""
    filled = {k: v for k, v in model_defaults(registry, target).items() if asked.get(k) is None}
    if any(asked.get(k) is not None for k in ("num_speculative_tokens", *TREE_SHAPE)) or \
            (asked.get("method") or filled.get("method")) != "eagle":
        filled = {k: v for k, v in filled.items() if k not in TREE_SHAPE}
    filled.update(method_defaults(asked))
    settings = {**filled, **{k: v for k, v in asked.items() if v is not None}}
    return settings, filled, unmet(registry, target, GenerationSettings.parse(settings))


def fit_request(registry, asked: dict, default: LoadedModel | None = None) -> Fit:
    """The model and settings a request runs with (the rule above). `asked`: the settings the request names (a
    value None counts as left out); `default`: the model when none is named (the registry's default target unless
    given). Raises SettingsError for a value out of range, an unknown model, or settings no model can take."""
    parsed = GenerationSettings.parse({k: v for k, v in asked.items() if v is not None})   # each value's range
    named = {k: getattr(parsed, k) for k, v in asked.items() if v is not None and k in GenerationSettings.model_fields}
    if parsed.model is not None:
        target = registry.models.get(parsed.model)
        if target is None:
            raise SettingsError("model", f"unknown model {excerpt(parsed.model)}; available: "
                                         f"{', '.join(m.name for m in registry.targets)}")
        if target.role != "target":
            raise SettingsError("model", f"{parsed.model!r} is a draft model; choose a target")
        settings, filled, why = _on(registry, target, named)
        if why is not None:
            raise why
        return Fit(target.name, settings, filled)
    default = default or registry.default_target()
    settings, filled, why = _on(registry, default, named)
    if why is None:
        if default is not registry.default_target():
            settings["model"] = default.name
        return Fit(default.name, settings, filled)
    for target in registry.targets:
        if target is default:
            continue
        other, other_filled, other_why = _on(registry, target, named)
        if other_why is None:
            value = named.get(why.setting)
            value = ("true" if value else "false") if isinstance(value, bool) else value
            reason = re.sub(r" \(.*\)$", "", str(why).split(": ", 1)[-1].split("; ")[0])     # its first clause
            note = f"{why.setting}={value}: {reason}, so {target.name} runs it instead of {default.name}"
            return Fit(target.name, {**other, "model": target.name}, other_filled, note)
    raise why
