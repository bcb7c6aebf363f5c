"""The page's state from its URL: every setting, the prompt, `autoplay`, `speed`, `theme`, `hide`, `presenter`, `view`,
`layout` (what a slide shows) and the race (`race`, `race_a`, `race_b`).

A URL reproduces a demo: the server renders the form with the URL's values (validated by the engine's
own settings model), and static/playground.js keeps the URL in step when the controls change. Values
that do not validate are ignored and listed on the page, so a broken link still opens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from app.presets import DEFAULT_PROMPT, PRESETS
from app.protocol import CommandError
from app.views.model_options import external_state, model_options, server_values, target_of
from app.views.race_pick import race_state, races_of
from engine.experiments.theory import worked_table
from engine.kv.dtypes import KV_CACHE_DTYPES
from engine.serving.request_fit import fit_request, model_defaults
from engine.serving.settings import (MAX_PROMPT_CHARS, METHODS, SUFFIX_SETTINGS, TREE_METHODS, GenerationSettings,
                                     SettingsError, excerpt)

# Settings the page offers as form fields (the contract's names). `fault` belongs to the teaching views.
FORM_SETTINGS = ["model", "chat", "max_tokens", "temperature", "top_p", "seed", "method", "num_speculative_tokens",
                 "speculative_eagle_topk", "speculative_num_draft_tokens", "num_speculative_tokens_schedule",
                 "rejection_sample_method", "draft_confidence_threshold", "prompt_lookup_min", "prompt_lookup_max", *SUFFIX_SETTINGS, "kv_cache", "kv_cache_dtype", "num_kv_heads",
                 "block_size", "enable_prefix_caching"]
BOOL_SETTINGS = {"kv_cache", "enable_prefix_caching", "chat"}
SPEEDS = [("0.5", "½ round/s"), ("1", "1 round/s"), ("2", "2 rounds/s"), ("5", "5 rounds/s"),
          ("10", "10 rounds/s"), ("25", "25 rounds/s"), ("max", "full speed")]
DEFAULT_SPEED = "5"
THEMES = ("light", "dark")
# The teaching views (templates/_teach.html, app/routers/teach/): `?view=NAME` opens one.
VIEWS = [("inspector", "Inspector"), ("theory", "Theory"), ("distribution", "Distribution"), ("memory", "KV memory"),
         ("paging", "Paging"), ("faults", "Faults"), ("cost", "Cost model"), ("race", "Race"), ("shootout", "Shoot-out"), ("replay", "Replay")]
VIEW_NAMES = tuple(name for name, _ in VIEWS)
# Parts of the page that `hide` can name (TensorFlow Playground's `_hide`): "views" is the teaching views'
# whole strip, "tabs" only its tabs (a view opened by the URL stays), and each view by its name.
# "sidebar" is the whole settings column (prompt, presets, controls, settings), "status" the run's status line.
HIDEABLE = ("header", "sidebar", "prompt", "presets", "controls", "settings", "status", "legend", "stream", "draft",
            "kv", "gauges", "chart", "notes", "footer", "views", "tabs", *VIEW_NAMES)
SIDEBAR_PARTS = ("prompt", "controls", "settings")
SIDE_COL_PARTS = ("gauges", "chart", "legend", "notes")
# Layouts for slides (`layout=`): what a 1280x720 frame shows, without scrolling (static/slides.css). "" is the
# whole page; "view:NAME" one teaching view, full size.
LAYOUTS = [("", "whole page"), ("stream", "slide: stream, draft lane, key gauges"), ("kv", "slide: stream and KV map"),
           ("gauges", "slide: stream, gauges and chart"),
           *((f"view:{n}", f"slide: {label} view") for n, label in VIEWS)]
LAYOUT_NAMES = tuple(name for name, _ in LAYOUTS)


# The gauges: (metric, label, unit). Each value element carries data-metric; its text is the current value.
GAUGES = [
    ("acceptance_rate", "Acceptance rate", "accepted ÷ drafted"),
    ("mean_acceptance_length", "Mean acceptance length", "tokens per round"),
    ("ttft_ms", "TTFT", "ms to first token"),
    ("itl_ms", "ITL", "ms between rounds"),
    ("tokens_per_s", "Tokens / s", "engine time"),
    ("kv_blocks_used", "Blocks used", "by this run"),
    ("kv_bytes_per_token", "KV bytes / token", "layers × 2 × KV heads × head dim × bytes"),
    # the target's (the contract's kv_cache.bytes_used); the draft pool's show beneath when it has a cache
    ("kv_cache_bytes", "KV bytes in use (target)", "its tokens held × bytes/token"),
]


def gauge_rows(texts: dict | None = None, human: str | None = None, changed=(), draft: str | None = None) -> list[dict]:
    """`human`: the target's KV bytes in use in KiB/MiB; `draft`: the draft pool's (None without one)."""
    texts = texts or {}
    return [{"name": n, "label": label, "unit": unit, "text": texts.get(n, "–"), "changed": n in changed,
             "human": human if n == "kv_cache_bytes" else None, "draft": draft if n == "kv_cache_bytes" else None}
            for n, label, unit in GAUGES]


def _truthy(value: str | None) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def form_value(name: str, value) -> str:
    """A setting's value as the form field holds it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if name not in ("temperature", "top_p") else f"{value:g}"
    return str(value)


@dataclass
class PageState:
    values: dict[str, str]                 # form value of every setting, and "prompt"
    defaults: dict[str, str]
    autoplay: bool = False
    speed: str = DEFAULT_SPEED
    theme: str = "light"
    presenter: bool = False
    hide: list[str] = field(default_factory=list)
    view: str | None = None                # the open teaching view
    layout: str = ""                       # one of LAYOUT_NAMES
    race: dict = field(default_factory=dict)   # {"setting", "a", "b"}: form values of the race's two sides
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)        # what the page chose for the URL, and why (one line)
    home_model: str = ""                   # the model field's value when the URL names none
    model_defaults: dict = field(default_factory=dict)    # model value -> its form defaults (static/playground.js)
    tree_methods: str = " ".join(TREE_METHODS)   # the methods that draft token trees (static/playground.js)

    def hidden(self, part: str) -> bool:
        if part in SIDEBAR_PARTS and "sidebar" in self.hide:
            return True
        return part in self.hide

    @property
    def layout_classes(self) -> str:
        """The grid's shape when a whole column is hidden (its track collapses)."""
        out = []
        if all(self.hidden(p) for p in SIDEBAR_PARTS):
            out.append("no-sidebar")
        if all(self.hidden(p) for p in SIDE_COL_PARTS):
            out.append("no-side-col")
        return " ".join(out)


def defaults() -> dict[str, str]:
    base = GenerationSettings()
    out = {name: form_value(name, getattr(base, name)) for name in FORM_SETTINGS}
    out["prompt"] = DEFAULT_PROMPT
    return out


# What the page shows on SmolLM2 when it opens on it (config demo "auto"): the instruct model's chat template and a
# question. Its method and drafting are the model's defaults (engine/serving/request_fit.py): EAGLE at the γ and
# threshold `bench heads` measured fastest (models/heads/smollm2-135m/demo.json).
SMOLLM2 = "smollm2-135m"
SMOLLM2_SHOWCASE = {"chat": "true", "prompt": "Explain how a rainbow forms, in a short paragraph."}


def home_target(playground):
    """The model the page opens on when its URL names none: SmolLM2 with its EAGLE head when fetched (config demo
    "auto"), else our default target. (`playground`, here and below: the app's Playground, app/state.py.)"""
    registry = playground.registry
    lm = registry.models.get(SMOLLM2)
    if playground.config.demo == "auto" and lm is not None and "eagle" in lm.meta.get("heads", []):
        return lm
    return registry.default_target()


def model_value(playground, target) -> str:
    """The model field's value for a target: its name, or "" (the select's "default (MHA)") for our default target
    where the page opens on it."""
    default = playground.registry.default_target()
    return "" if target is default and home_target(playground) is default else target.name


def target_defaults(playground, target) -> dict[str, str]:
    """The form's values on `target` for what a URL leaves out: GenerationSettings' defaults with the model's own
    (engine/serving/request_fit.py), and SmolLM2's chat template and question when the page shows it off."""
    out = defaults()
    out.update({k: form_value(k, v) for k, v in model_defaults(playground.registry, target).items()})
    if target.name == SMOLLM2 and playground.config.demo == "auto":
        out.update(SMOLLM2_SHOWCASE)
    out["model"] = model_value(playground, target)
    return out


def page_state(query, playground) -> PageState:
    """Validate the query string (a starlette QueryParams or a dict) into the page's state."""
    registry = playground.registry
    warnings: list[str] = []
    asked = _url_settings(query, playground, warnings)
    if registry is None:                             # no models: the form as it would be, the load error shown
        state = PageState(values=defaults(), defaults=defaults(), warnings=warnings)
        state.values.update({k: form_value(k, v) for k, v in asked.items()})
    elif asked.get("model") in playground.external:  # an external engine: its server sets the drafting
        state = PageState(values=defaults(), defaults=target_defaults(playground, home_target(playground)),
                          warnings=warnings)
        state.values.update({k: form_value(k, v) for k, v in asked.items()})
    else:
        fit = url_fit(registry, asked, home_target(playground), warnings)
        target = registry.models[fit.model]
        state = PageState(values=target_defaults(playground, target), defaults=target_defaults(playground, target),
                          warnings=warnings, notes=[fit.note] if fit.note else [])
        # the settings the engine runs for this URL (its fit); a model default it left out (the demo's tree under a
        # method that drafts none) shows as ours
        state.values.update({k: form_value(k, v) for k, v in fit.settings.items() if k != "model"})
        ours = defaults()
        state.values.update({k: ours[k] for k in model_defaults(registry, target) if k not in fit.settings})
        state.home_model = model_value(playground, home_target(playground))
        state.model_defaults = {model_value(playground, t): target_defaults(playground, t)
                                for t in (registry.default_target(), *registry.targets)}
        state.model_defaults.setdefault("", target_defaults(playground, registry.default_target()))
    _url_presentation(query, state)
    if registry is not None:
        # the form's model: the URL's, else the one the engine chose for it (SmolLM2 on a fetched machine)
        state.race = race_state(query, registry, target_of(registry, state.values["model"] or None), state.warnings,
                                list(playground.external))
    return state


def url_fit(registry, asked: dict, home, warnings: list[str]):
    """The engine's choice of model for the URL's settings and the settings it runs (engine/serving/request_fit.py): a
    setting the URL's own model cannot take is ignored, with a warning naming it."""
    asked = dict(asked)
    while True:
        try:
            return fit_request(registry, asked, home)
        except SettingsError as e:
            if e.setting not in asked:               # (cannot be: every default runs on its own model)
                return fit_request(registry, {}, home)
            warnings.append(f"ignored {e.setting}={excerpt(form_value(e.setting, asked.pop(e.setting)))} from the "
                            f"URL: {e}")


def _url_settings(query, playground, warnings: list[str]) -> dict:
    """The generation settings of the URL that are valid values (each one refused is a warning); an empty
    `model` is our default target."""
    valid: dict = {}
    for name in FORM_SETTINGS:
        if name not in query:
            continue
        raw = query.get(name)
        try:
            parsed = GenerationSettings.parse({name: raw}, alone=True)   # the rules between them: below
        except SettingsError as e:
            warnings.append(f"ignored {name}={excerpt(raw)} from the URL: {e}")
            continue
        valid[name] = getattr(parsed, name)
    try:                                                 # cross-field rules (e.g. lookup min <= max)
        GenerationSettings.parse(valid)
    except SettingsError as e:
        warnings.append(f"ignored {e.setting} from the URL: {e}")
        valid.pop(e.setting, None)
    registry = playground.registry
    if registry is not None and "model" in valid:
        if valid["model"] is None:
            valid["model"] = registry.default_target().name
        elif valid["model"] not in {m.name for m in registry.targets} and valid["model"] not in playground.external:
            warnings.append(f"ignored model={excerpt(valid.pop('model'))} from the URL: not a target model here")
    return valid


def _url_presentation(query, state: PageState) -> None:
    """The prompt, autoplay, speed, theme, presenter mode, hidden parts, layout and view of the URL."""
    if "prompt" in query:
        prompt = query.get("prompt", "")
        if len(prompt) > MAX_PROMPT_CHARS:
            state.warnings.append(f"prompt from the URL cut to {MAX_PROMPT_CHARS} characters")
            prompt = prompt[:MAX_PROMPT_CHARS]
        state.values["prompt"] = prompt
    state.autoplay = _truthy(query.get("autoplay"))
    speed = query.get("speed")
    if speed is not None:
        if speed in {s for s, _ in SPEEDS}:
            state.speed = speed
        else:
            state.warnings.append(f"ignored speed={excerpt(speed)} from the URL: one of {', '.join(s for s, _ in SPEEDS)}")
    theme = query.get("theme")
    if theme is not None:
        if theme in THEMES:
            state.theme = theme
        else:
            state.warnings.append(f"ignored theme={excerpt(theme)} from the URL: light or dark")
    state.presenter = _truthy(query.get("presenter"))
    hide = []
    for raw in (query.getlist("hide") if hasattr(query, "getlist") else [query.get("hide", "")]):
        hide += [h.strip() for h in (raw or "").split(",") if h.strip()]
    unknown = [h for h in hide if h not in HIDEABLE]
    if unknown:
        state.warnings.append(f"ignored hide={excerpt(','.join(unknown))} from the URL: parts are {', '.join(HIDEABLE)}")
    state.hide = [h for h in HIDEABLE if h in hide]
    layout = query.get("layout")
    if layout:
        if layout not in LAYOUT_NAMES:
            state.warnings.append(f"ignored layout={excerpt(layout)} from the URL: one of {', '.join(LAYOUT_NAMES[1:])}")
        else:
            state.layout = layout
    view = query.get("view")
    if state.layout.startswith("view:"):
        view = state.layout[len("view:"):]
    if view:
        if view not in VIEW_NAMES:
            state.warnings.append(f"ignored view={excerpt(view)} from the URL: one of {', '.join(VIEW_NAMES)}")
        elif not (state.hidden(view) or state.hidden("views")):
            state.view = view


def view_links(query) -> dict[str, str]:
    """Each view's tab link: this page's URL with `view` set ("" closes the view)."""
    items = [(k, v) for k, v in (query.multi_items() if hasattr(query, "multi_items") else query.items())
             if k != "view"]
    return {name: "?" + urlencode(items + ([("view", name)] if name else [])) for name in ("", *VIEW_NAMES)}


# What an external engine fixes when it starts (its KV cache, attention and drafter) and the chat template its
# chat endpoint applies to every request: the page disables them.
SERVER_SET_CONTROLS = tuple(f"f-{name}" for name in FORM_SETTINGS
                            if name not in ("model", "max_tokens", "temperature", "top_p", "seed"))


def server_set(model: str | None, external, registry=None) -> dict:
    """The controls that cannot apply to `model`, why, and the values its server is known to run with (none for
    our own models); static/playground.js shows those values in the disabled controls, "set by the server" in the
    others."""
    if model not in external:
        return {"reason": "", "controls": [], "values": {}}
    return {"reason": f"{model}: set by the server at start-up (KV cache, KV heads, block size, drafter; its chat "
                      "template on every request)",
            "controls": list(SERVER_SET_CONTROLS), "values": server_values(external[model], registry)}


def page_context(query, playground, embed: bool) -> dict:
    registry = playground.registry
    state = page_state(query, playground)
    targets, races = [], {}
    options = {"variants": [], "draft": None, "chat": False, "heads": [], "default_method": "draft_model",
               "methods": [{"value": m, "label": m, "available": True, "why": ""} for m in METHODS]}
    if registry is not None:
        loading = playground.loading()
        targets = [{"name": m.name, "label": f"{m.name} ({m.cfg.attention_kind})"
                    + (" · loading…" if m.name in loading else "")} for m in registry.targets]
        options = model_options(registry, state.values["model"] or None)
        target = target_of(registry, state.values["model"] or None)
        races = races_of(registry, target, list(playground.external))
    targets += [{"name": name, "label": name + external_state(e), "external": True}     # app/ws/external.py
                for name, e in playground.external.items()]
    return {
        "state": state, "embed": embed, "presets": PRESETS, "speeds": SPEEDS,
        "targets": targets, "model_options": options,
        "kv_cache_dtypes": list(KV_CACHE_DTYPES), "load_error": playground.load_error,
        "hideable": HIDEABLE, "max_prompt_chars": MAX_PROMPT_CHARS, "gauge_rows": gauge_rows(),
        "views": VIEWS, "view_links": view_links(query), "worked_table": worked_table(),
        "layouts": LAYOUTS, "races": races, "server_set": server_set(state.values["model"], playground.external, registry),
    }


def form_field_value(name: str, value):
    """A form field's value: text (numbers, booleans and null are taken as they are) or the last of a list
    (a checkbox with its hidden "false" twin); anything else is a CommandError naming the field."""
    if isinstance(value, list) and value:
        value = value[-1]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    kind = "an object" if isinstance(value, dict) else "an empty list" if value == [] else "a list in a list"
    raise CommandError(f"{name}: expected a text value, got {kind}", name)
