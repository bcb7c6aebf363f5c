"""The Race's picker: which races a target offers (its settings' values, and a race of engines where other
engines are configured) and the pair a URL asks for, checked against them."""
from __future__ import annotations

from engine.experiments.race import default_values, form_text, race_choices
from engine.external import engine_race
from engine.serving.settings import excerpt


RACE_LABELS = {"method": "method", "kv_cache": "KV cache on / off", "num_kv_heads": "MHA / GQA / MQA",
               "kv_cache_dtype": "cache dtype", "num_speculative_tokens": "γ (draft tokens)",
               "speculative_eagle_topk": "chain / token tree", "speculative_num_draft_tokens": "token tree's budget"}


def race_state(query, registry, target, warnings: list[str], engines: list[str]) -> dict:
    """The race's setting and its two values from the URL, each checked against what the target offers
    (`engines`: the configured external engines, for a race of engines)."""
    choices = races_of(registry, target, engines)
    setting = query.get("race") or "method"
    if setting not in choices:
        warnings.append(f"ignored race={excerpt(setting)} from the URL: one of {', '.join(choices)}")
        setting = "method"
    offered = [v for v, _ in choices[setting]["choices"]]
    default = choices[setting]["default"]
    pair = list(default)
    for i, name in enumerate(("race_a", "race_b")):
        value = query.get(name)
        if value is None:
            continue
        if value in offered:
            pair[i] = value
        else:
            warnings.append(f"ignored {name}={excerpt(value)} from the URL: for race={setting}, one of {', '.join(offered)}")
    if pair[0] == pair[1] and pair != default:
        warnings.append("ignored race_a and race_b from the URL: the two sides must differ")
        pair = default
    return {"setting": setting, "a": pair[0], "b": pair[1]}


def races_of(registry, target, engines: list[str]) -> dict:
    """Each race the page offers: its label, its values (form value, label) and the pair it starts from."""
    races = {name: {"label": RACE_LABELS[name], "choices": choices,
                    "default": [form_text(v) for v in default_values(registry, target, name)]}
             for name, choices in race_choices(registry, target).items()}
    if engines:
        races[engine_race.SETTING] = {"label": engine_race.LABEL, "choices": engine_race.engine_choices(engines),
                                      "default": list(engine_race.engine_pair(None, engines))}
    return races
