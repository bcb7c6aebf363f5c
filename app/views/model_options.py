"""What the page's form offers for a target model (its KV-head variants, draft model, chat template and drafters),
and what it shows of a model an external engine serves (the settings that engine runs with, whether it is ready)."""
from __future__ import annotations

from engine.serving.request_fit import model_defaults


def target_of(registry, name: str | None):
    """The target model a form value names (the default target for "" or an unknown name); loads nothing."""
    lm = registry.models.get(name) if name else None
    return lm if lm is not None and lm.role == "target" else registry.default_target()


METHOD_LABELS = {"none": "none (plain decoding)", "draft_model": "draft model", "ngram": "n-gram lookup",
                 "medusa": "Medusa heads", "eagle": "EAGLE head", "suffix": "suffix decoding"}


def model_options(registry, name: str | None) -> dict:
    """What the form offers for a target: its KV-head variants, its draft model, whether it has a chat template."""
    target = target_of(registry, name)
    variants = [{"value": str(n), "label": f"{n} — {lm.cfg.attention_kind}"}
                for n, lm in sorted(registry.variants(target).items(), reverse=True)]
    draft = registry.draft_for(target)
    chat = target.tokenizer is not None and getattr(target.tokenizer, "chat_template", None) is not None
    heads = target.meta.get("heads", [])
    methods = [{"value": value, "label": METHOD_LABELS[value], "available": ok, "why": why} for value, ok, why in [
        ("none", True, ""),
        ("draft_model", draft is not None, "no draft model shares this target's vocabulary"),
        ("ngram", True, ""),
        ("suffix", True, ""),
        ("medusa", "medusa" in heads, "no Medusa heads trained for this target"),
        ("eagle", "eagle" in heads, "no EAGLE head trained for this target")]]
    return {"target": target.name, "attention": target.cfg.attention_kind,
            "num_kv_heads": target.cfg.num_key_value_heads, "variants": variants,
            "draft": draft.name if draft else None, "chat": chat, "heads": heads, "methods": methods,
            "default_method": model_defaults(registry, target)["method"]}


def model_note(opts: dict) -> str:
    """The line the notes get when another target is chosen: its attention, chat template and drafters."""
    draft = f"draft model {opts['draft']}" if opts["draft"] else "no draft model shares its vocabulary"
    heads = f"; draft heads: {', '.join(opts['heads'])}" if opts["heads"] else ""
    chat = ", has a chat template" if opts["chat"] else ""
    return f"{opts['target']}: {opts['num_kv_heads']} KV heads ({opts['attention']}){chat}; {draft}{heads}"


def server_values(engine, registry) -> dict:
    """An external engine's settings as the panel shows them, by control: the chat template (its chat endpoint
    applies it to every request), its speculative method where it says which, and the KV heads of our model
    whose weights it serves (`our_model`, as vLLM and llama.cpp here do)."""
    d = engine.description
    values = {"f-chat": True}
    if d.get("speculative_method") in METHOD_LABELS:
        values["f-method"] = METHOD_LABELS[d["speculative_method"]]
    lm = registry.models.get(d["our_model"]) if registry is not None and d.get("our_model") else None
    if lm is not None:
        values["f-num_kv_heads"] = f"{lm.cfg.num_key_value_heads} — {lm.cfg.attention_kind}"
    return values


def external_state(engine) -> str:
    """' (starting…)' or ' (failed)' for a server the app starts (vLLM) that is not ready; '' otherwise."""
    state = engine.description.get("state")
    return "" if state in (None, "ready") else f" ({'starting…' if state == 'starting' else state})"
