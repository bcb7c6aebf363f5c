"""`/ws`: the page's form messages in (htmx-ext-ws `ws-send`), HTML fragments out (swapped out-of-band by id).

Client messages are the playground form's fields as JSON (values as strings, a checkbox with its hidden
"false" twin as a list) plus `HEADERS`; buttons add `action` through `hx-vals`. A message without an
action is a change of the form: live settings go to the running session, the others apply next run.

Server messages: one per batch of items (coalesced), each top-level element with an `id` and
`hx-swap-oob`. Tokens are appended to #stream; the status, the draft lane, gauges and KV map segments are
replaced by id, and only their latest state in a batch is sent. docs/protocol.md lists every id.

NOTE (invariants): the view remembers per connection what it last rendered (gauge texts, each KV
block's state) and sends only what changed; a KV pool seen for the first time (or another dtype /
block size) is sent whole.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from app.connection import Batch, Command, CommandError, Connection, Notice, json_object, parse_speed
from app.page import DEFAULT_SPEED, FORM_SETTINGS, GAUGES, gauge_rows, model_options
from app.recording import RECORDINGS
from app.state import Playground
from app.templating import templates
from engine.settings import LIVE_SETTINGS, excerpt

METRICS = tuple(name for name, _, _ in GAUGES)
ACTIONS = ("toggle", "start", "step", "pause", "resume", "stop", "reset")
STATE_LETTERS = {"f": "free", "c": "cached", "u": "used", "s": "shared"}
# The KV map is sent in segments of this many blocks: a round changes a few neighbouring blocks, and one
# segment is one swapped element (htmx's work per message grows with the square of its top-level elements,
# see templates/_fragments.html); a whole pool is a few hundred blocks.
KV_SEGMENT = 32
FULL_GRID_ABOVE = 4            # more changed segments than this: send the whole grid in one element
SETTING_LABELS = {"num_speculative_tokens": "γ", "kv_cache_dtype": "KV dtype", "num_kv_heads": "KV heads",
                  "enable_prefix_caching": "prefix caching", "kv_cache": "KV cache", "block_size": "block size",
                  "temperature": "temperature", "top_p": "top-p", "method": "method", "max_tokens": "max tokens",
                  "prompt_lookup_min": "n-gram min", "prompt_lookup_max": "n-gram max",
                  "num_speculative_tokens_schedule": "γ schedule"}

_macros = None
_WHITESPACE = {"\n": '<span class="ws" aria-hidden="true">↵</span>\n',
               "\t": '<span class="ws" aria-hidden="true">⇥</span>\t',
               "<|endoftext|>": '<span class="eos">⟨end of text⟩</span>'}


def piece(text: str) -> Markup:
    """A token's text as HTML: escaped, with newline, tab and end of text made visible."""
    special = _WHITESPACE.get(text)
    return Markup(special) if special is not None else escape(text)


def shown(text: str) -> Markup:
    """A token standing alone (a draft-lane chip, the inspector, histograms): spaces made visible as ␣ (a chip
    of blanks looks empty), newline and tab as the stream shows them."""
    if text in _WHITESPACE:
        return piece(text)
    return Markup("").join(Markup('<span class="ws-vis">␣</span>') if ch == " " else escape(ch) for ch in text)


def _p(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def layers(model: dict) -> str:
    n = model["num_hidden_layers"]
    return f"{n} layer{'s' if n != 1 else ''}"


def model_line(info: str, model: dict, step_ms: float | None) -> str:
    """The model line, with a model's measured floor beside its measured decode step when it has one (a model
    whose weights do not fit in the caches: its step streams them all, engine/layout.py)."""
    floor = model.get("weights_stream_ms")
    if floor is None:
        return info
    if step_ms is None:
        gb_s = model["weight_bytes"] / floor / 1e6
        return f"{info} · its {model['weight_bytes'] / 1e6:.0f} MB of weights stream in {floor:.1f} ms here ({gb_s:.0f} GB/s)"
    return (f"{info} · decode {step_ms:.1f} ms, weights stream in {floor:.1f} ms: {floor / step_ms:.0%} of "
            "this machine's memory bandwidth")


def token_html(t) -> str:
    """One streamed token. Built here rather than by a template macro: it is the hot path at full speed
    (several macro calls per token); every value that is not a fixed string is escaped."""
    title = f"{t.status} · p={_p(t.p)}"
    if t.q is not None:
        title += f" · q={_p(t.q)}"
    if t.accept_prob is not None:
        title += f" · min(1, p/q)={_p(t.accept_prob)}"
    if t.r is not None:
        title += f" · r={_p(t.r)}"
    return (f'<span class="tok" data-token-status="{escape(t.status)}" data-round="{int(t.round)}" '
            f'data-pos="{int(t.position)}" title="{escape(title)}">{piece(t.text)}</span>')


ROLE_RE = re.compile(r"<\|im_start\|>(\w+)")


def prompt_parts(prompt_tokens: list[dict]) -> dict:
    """The prompt as the stream shows it: `head`, its lines up to the last line break (a block, compacted),
    and `tail`, the line the answer continues. Each is a list of runs {"template", "texts", "label"}: a chat
    template's runs collapse to their label (the roles they open) until clicked."""
    cut = max((i + 1 for i, t in enumerate(prompt_tokens) if "\n" in t["text"]), default=0)
    out = {}
    for name, tokens in (("head", prompt_tokens[:cut]), ("tail", prompt_tokens[cut:])):
        runs = []
        for t in tokens:
            template = bool(t.get("template"))
            if not runs or runs[-1]["template"] != template:
                runs.append({"template": template, "texts": []})
            runs[-1]["texts"].append(t["text"])
        for run in runs:
            roles = ", ".join(ROLE_RE.findall("".join(run["texts"]))) or "end of turn"
            run["label"] = f"chat template: {roles} · {len(run['texts'])} tokens"
        out[name] = runs
    return out


templates.env.globals["piece"] = piece        # for templates/_fragments.html
templates.env.globals["prompt_parts"] = prompt_parts
templates.env.filters["shown"] = shown


def kv_cell_html(c: dict) -> str:
    """One KV block cell. Built here rather than by a template macro: a whole pool is hundreds of cells (a
    macro call each was most of the time spent drawing the KV map)."""
    event = f' data-event="{escape(c["event"])}"' if c["event"] else ""
    mine = ' data-mine="1"' if c["mine"] else ""
    return f'<i class="kv" data-kv-block="{int(c["id"])}" data-state="{escape(c["state"])}"{event}{mine}></i>'


def kv_segment_html(role: str, k: int, cells: list, oob: bool = False) -> str:
    """Segment `k` of a pool: KV_SEGMENT cells in a wrapper that takes no part in layout (CSS
    display: contents), so that a change is one swapped element whatever the number of its blocks."""
    attrs = ' hx-swap-oob="true"' if oob else ""
    return (f'<span id="kv-{escape(role)}-s{int(k)}"{attrs} class="kv-seg">'
            + "".join(kv_cell_html(c) for c in cells) + "</span>")


def kv_grid_html(role: str, pool: dict, cells: list) -> str:
    """A whole pool: every cell, in segments."""
    segments = "".join(kv_segment_html(role, k, cells[k * KV_SEGMENT:(k + 1) * KV_SEGMENT])
                       for k in range((len(cells) + KV_SEGMENT - 1) // KV_SEGMENT))
    return (f'<div id="kv-{escape(role)}-grid" hx-swap-oob="true" class="kv-grid" data-pool="{escape(pool["name"])}" '
            f'data-kv-cache-dtype="{escape(pool["kv_cache_dtype"])}" data-block-size="{escape(pool["block_size"])}">'
            + segments + "</div>")


def macros():
    """The fragment macros of templates/_fragments.html (autoescaped: it is an .html template)."""
    global _macros
    if _macros is None:
        _macros = templates.env.get_template("_fragments.html").module
    return _macros


def fmt_metric(name: str, value) -> str:
    """A gauge's text: the plain current value (no unit, no thousands separator), or '–'."""
    if value is None:
        return "–"
    if name in ("kv_cache_bytes", "kv_bytes_per_token", "kv_blocks_used"):
        return str(int(value))
    if name == "tokens_per_s":
        return f"{value:.0f}"
    if name in ("ttft_ms", "itl_ms"):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{value:.2f}"


def human_bytes(n) -> str | None:
    if n is None:
        return None
    for unit, size in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def setting_text(name: str, value) -> str:
    label = SETTING_LABELS.get(name, name)
    if isinstance(value, bool):
        value = "on" if value else "off"
    elif value is None:
        value = "model's own"
    return f"{label} = {value}"


@dataclass
class RenderedPool:
    key: tuple                  # (pool name, kv_cache_dtype, block_size): one KV cache manager
    states: str
    table: frozenset
    pool: dict


@dataclass
class Frame:
    """What one outgoing message will hold."""
    replace: dict = field(default_factory=dict)          # element id -> html (the latest wins)
    appends: dict = field(default_factory=dict)          # target id -> [html] in order
    kv_events: list = field(default_factory=list)
    kv_snapshot: bool = False
    metrics: dict | None = None
    chart: list = field(default_factory=list)            # packed latency-chart points of this message
    lane: dict | None = None                             # the draft lane to draw (once, after the last round)

    def append(self, target: str, html: str) -> None:
        self.appends.setdefault(target, []).append(html)


def _form_value(name: str, value):
    """A form field's value: text (numbers, booleans and null are taken as they are) or the last of a list
    (a checkbox with its hidden "false" twin); anything else is a CommandError naming the field."""
    if isinstance(value, list) and value:
        value = value[-1]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    kind = "an object" if isinstance(value, dict) else "an empty list" if value == [] else "a list in a list"
    raise CommandError(f"{name}: expected a text value, got {kind}", name)


class HtmlView:
    default_speed = float(DEFAULT_SPEED)
    acks = True         # the page acknowledges what it has rendered ({"ack": n}, static/playground.js)

    def __init__(self, playground: Playground):
        self.playground = playground
        self.form: dict = {}
        self.form_prompt: str | None = None
        self.kv: dict[str, RenderedPool] = {}
        self.gauges: dict[str, str] = {}
        self.status = {"state": "idle", "round": 0, "tokens": 0, "gamma": None, "finish": None}
        self.lane: dict | None = None
        self.run_model_line: tuple[str, dict] | None = None     # the run's model line, and its model's figures
        self.run_id: int | None = None
        self.external = False           # the run is on an external engine (app/external.py)
        self.recording = None           # the current run's events, kept for export, the inspector, replay
        self._recording_owner = False
        self._snapshotting = False
        self._conn: Connection | None = None

    # --- client messages -------------------------------------------------------------------------
    def hello(self, conn: Connection) -> None:
        conn.notice("hello")

    def parse(self, text: str, conn: Connection) -> list[Command]:
        data = json_object(text, "expected the playground form as a JSON object")
        if data.keys() == {"ack"}:              # the page has rendered this many of our messages
            if not isinstance(data["ack"], int) or isinstance(data["ack"], bool):
                raise CommandError("ack: the number of messages rendered")
            return [Command("ack", ack=data["ack"])]
        data.pop("HEADERS", None)
        fields = {k: _form_value(k, data[k]) for k in (*FORM_SETTINGS, "prompt", "speed", "action") if k in data}
        action = fields.pop("action", None)
        settings = {k: fields[k] for k in FORM_SETTINGS if k in fields}
        prompt = fields.get("prompt")
        speed = parse_speed(fields["speed"]) if "speed" in fields else "keep"
        if action in (None, "", "settings"):
            return self._form_changed(settings, prompt, speed, conn)
        if action == "replay":
            # the page is about to swap in a replay (static/teach.js): end the run and forget what this view
            # has drawn, so that the next run draws everything afresh
            self.kv.clear()
            self.gauges.clear()
            return [Command("reset")]
        if action not in ACTIONS:
            raise CommandError(f"unknown action {excerpt(action)}; expected one of {', '.join(ACTIONS)}")
        if action in ("toggle", "start", "step") and prompt is not None:
            starting = action == "start" or conn.state in ("idle", "done")
            if starting:
                self.form, self.form_prompt = settings, prompt
        return [Command(action, prompt=prompt, settings=settings, speed=speed)]

    def _form_changed(self, settings: dict, prompt: str | None, speed, conn: Connection) -> list[Command]:
        old, self.form = self.form, settings
        old_prompt, self.form_prompt = self.form_prompt, prompt
        commands = [Command("speed", speed=speed)] if speed != "keep" and speed != conn.speed else []
        # the first message has no baseline: the page was rendered with the default model or the URL's
        if (settings.get("model") or "") != (old.get("model") or "") and self.playground.registry is not None:
            conn.notice("model_options", model=settings.get("model") or None,
                        num_kv_heads=settings.get("num_kv_heads"))
        if conn.state not in ("running", "paused"):
            return commands
        changed = {k: v for k, v in settings.items() if old.get(k) != v}
        live = {k: v for k, v in changed.items() if k in LIVE_SETTINGS}
        for name in sorted(set(changed) - set(live)):
            value = str(changed[name] or "–")[:40]
            conn.notice("note", kind="next_run", text=f"{name} = {value}: applies to the next run")
        if prompt is not None and old_prompt is not None and prompt != old_prompt:
            conn.notice("note", kind="next_run", text="the new prompt applies to the next run")
        if live:
            commands.append(Command("settings", settings=live))
        return commands

    # --- server messages -------------------------------------------------------------------------
    def render(self, items: list, conn: Connection) -> list[str]:
        m = macros()
        self._conn = conn
        frame = Frame()
        status_before = dict(self.status)
        current = conn.run.run_id if conn.run else None
        recording, was_complete = self.recording, self.recording is None or self.recording.complete
        for item in items:
            if isinstance(item, Notice):
                self._notice(item, frame, conn)
            elif isinstance(item, Batch) and item.run_id == current:
                for event in item.events:
                    self._record(event)
                    getattr(self, "_on_" + event.type, self._on_other)(event, frame, item.run_id)
        # the run ended in this message: the pools drawn after it are kept with its recording
        self._snapshotting = self._recording_owner and self.recording.complete and (
            self.recording is not recording or not was_complete)
        if frame.kv_events or frame.kv_snapshot:
            self._render_kv(frame)
        self._snapshotting = False
        if self.recording is not None and self.recording.complete and "run-recording" in frame.replace:
            frame.replace["run-recording"] = m.run_recording(self.recording)   # now with its final size
        if frame.metrics is not None:
            self._render_gauges(frame.metrics, frame)
        if self.status != status_before:
            frame.replace["run-status"] = m.status(self._status_view())
        if frame.lane is not None:     # drawn once per message, not once per round (most of render's time)
            frame.replace["draft-lane"] = m.lane(frame.lane)
        if frame.chart:           # one element for all of this message's rounds (one per round costs the browser)
            frame.append("chart-feed", f'<i data-points="{",".join(frame.chart)}"></i>')
        parts = list(frame.replace.values())
        for target, htmls in frame.appends.items():
            # one wrapper element per target: htmx (and its ws extension) then process one new element per
            # message instead of one per token, which is most of the browser's work at full speed
            inner = "".join(htmls)
            if target not in ("notes", "chart-feed"):
                inner = f'<span class="chunk">{inner}</span>'
            parts.append(f'<div id="{target}-append" hx-swap-oob="beforeend:#{target}">{inner}</div>')
        return ["".join(parts)] if parts else []

    def _status_view(self) -> dict:
        s = self.status
        labels = {"idle": "Ready", "running": "Running", "paused": "Paused", "stopping": "Stopping",
                  "done": "Done", "error": "Error"}
        detail = []
        if s["state"] == "queued":
            return {"state": "queued", "round": 0, "label": "Waiting",
                    "detail": f"all slots busy: number {s.get('position')} in line"}
        prefill = s.get("prefill")                # (tokens computed, tokens) while prefilling in chunks
        if prefill:
            detail.append(f"prefill {prefill[0]:,} of {prefill[1]:,} tokens")
        elif s["state"] != "idle":
            detail.append(f"round {s['round']}")
            detail.append(f"{s['tokens']} tokens")
            if s["gamma"] is not None and s["state"] != "done":
                detail.append(f"γ {s['gamma']}")
            if s["finish"]:
                detail.append({"length": "max tokens reached", "stop": "end of text", "cancelled": "stopped",
                               "context": "context full"}.get(s["finish"], s["finish"]))
        return {"state": s["state"], "round": s["round"], "label": labels.get(s["state"], s["state"]),
                "detail": " · ".join(detail), "run": s.get("run"),
                "prefill": prefill and f"{prefill[0]}/{prefill[1]}"}

    # --- notices -----------------------------------------------------------------------------------
    def _notice(self, item: Notice, frame: Frame, conn: Connection) -> None:
        m, d = macros(), item.data
        if item.type == "hello":
            frame.replace["conn"] = m.conn("connected")
            frame.replace["run-status"] = m.status(self._status_view())
        elif item.type == "state":
            # before the run's first event is shown, and after its last, the events decide the state
            if self.status["state"] in ("running", "paused", "stopping") and d["state"] in ("running", "paused",
                                                                                           "stopping"):
                self.status["state"] = d["state"]
            elif self.status["state"] == "queued" and d["state"] == "idle":     # left the line
                self.status = {"state": "idle", "round": 0, "tokens": 0, "gamma": None, "finish": None}
        elif item.type == "queued":         # waiting for a free slot (admission control)
            self.status = {"state": "queued", "round": 0, "tokens": 0, "gamma": None, "finish": None,
                           "position": d["position"]}
        elif item.type == "settings_queued":
            text = ", ".join(setting_text(k, v) for k, v in d["changes"].items())
            frame.append("notes", m.note("settings_queued", f"{text}: queued, applies at the next round"))
        elif item.type == "model_options" and d["model"] in self.playground.external:
            frame.append("notes", m.note("model", f"{d['model']}: an external engine; KV cache dtype, KV heads, "
                                                  "block size and drafter are set by the server at start-up"))
        elif item.type == "model_options":
            opts = model_options(self.playground.registry, d["model"])
            value = d["num_kv_heads"] if d["num_kv_heads"] in {v["value"] for v in opts["variants"]} else ""
            frame.replace["f-num_kv_heads"] = m.kv_heads_select(opts, value)
            method = self.form.get("method") or opts["default_method"]
            frame.replace["f-method"] = m.method_select(opts, method if method in opts["heads"] or method in (
                "none", "ngram") or (method == "draft_model" and opts["draft"]) else "none")
            draft = (f"draft model {opts['draft']}" if opts["draft"] else
                     "no draft model shares its vocabulary: use n-gram lookup or none")
            chat = ", has a chat template" if opts["chat"] else ""
            if opts["heads"]:
                draft += f"; draft heads: {', '.join(opts['heads'])}"
            frame.append("notes", m.note("model", f"{opts['target']}: {opts['num_kv_heads']} KV heads "
                                                  f"({opts['attention']}){chat}; {draft}"))
        elif item.type == "note":
            frame.append("notes", m.note(d.get("kind", "note"), d["text"]))
        elif item.type == "error":
            frame.replace["error"] = m.error(d["message"])
            frame.append("notes", m.note("error", d["message"]))
        elif item.type == "reset":
            self.run_id, self.lane = None, None
            self.status = {"state": "idle", "round": 0, "tokens": 0, "gamma": None, "finish": None}
            frame.replace["stream"] = m.stream_empty()
            frame.appends.pop("stream", None)
            frame.replace["draft-lane"] = m.lane_empty("The draft lane shows each round's proposal and verdicts.")
            frame.lane = None
            frame.replace["chart-feed"] = m.chart_reset("reset")
            frame.appends.pop("chart-feed", None)
            frame.chart.clear()
            frame.replace["summary"] = m.summary(None)
            frame.replace["error"] = m.error(None)
            frame.metrics = {}
            frame.kv_snapshot = True

    # --- engine events -----------------------------------------------------------------------------
    def _record(self, event) -> None:
        """Keep the run's events (app/recording.py): the first view of a run records it, the others (a room's
        watchers) refer to that recording."""
        if event.type == "started":
            self.recording, self._recording_owner = RECORDINGS.claim(event.session_id, self.form_prompt)
        if self.recording is not None and self._recording_owner:
            self.recording.add(event)

    def _on_started(self, e, frame: Frame, run_id: int) -> None:
        m = macros()
        self.run_id, self.lane = run_id, None
        gamma = e.settings["num_speculative_tokens"] if e.settings["method"] != "none" else None
        # the run's id is part of its status: a run that ends as the one before did (same rounds and tokens,
        # rendered in one message by a watcher's broadcaster) still redraws the status as its own
        self.status = {"state": "paused" if self._conn.paused else "running", "round": 0, "tokens": 0,
                       "gamma": gamma, "finish": None, "run": run_id}
        frame.replace["stream"] = m.stream(e.prompt_tokens, run_id, self.recording.key if self.recording else "")
        frame.replace["run-recording"] = m.run_recording(self.recording)
        frame.appends.pop("stream", None)
        frame.replace["draft-lane"] = m.lane_empty("Prefill next: the prompt goes through the target in one forward.")
        frame.lane = None
        frame.replace["chart-feed"] = m.chart_reset(run_id)
        frame.appends.pop("chart-feed", None)
        frame.chart.clear()
        frame.replace["summary"] = m.summary(None)
        frame.replace["error"] = m.error(None)
        frame.metrics = {}
        md = e.model
        self.external = bool(md.get("external"))
        if self.external:                # a server the operator configured (app/external.py)
            threads = f", {md['threads']} thread(s)" if md.get("threads") else ""
            pub = md.get("published") or {}
            says = ", ".join(f"{k} {pub[k]}" for k in ("model_ftype", "n_ctx", "total_slots") if pub.get(k))
            info = (f"{md['name']}: an external engine ({md['engine']}{threads}); its KV cache dtype, KV heads, "
                    "block map and drafter are set by the server at start-up"
                    + (f" · the server says: {says}" if says else ""))
        else:
            info = (f"{md['name']}: {layers(md)} × width {md['hidden_size']}, {md['num_attention_heads']} query "
                    f"heads, {md['num_key_value_heads']} KV heads ({md['attention']})")
        if e.draft_model and e.settings["method"] == "draft_model":
            dm = e.draft_model
            info += f" · draft model ({dm['name']}): {layers(dm)} × width {dm['hidden_size']}"
        self.run_model_line = (info, md)
        frame.replace["model-info"] = m.model_info(model_line(info, md, None))
        frame.append("notes", m.note("started", f"new run: {len(e.prompt_tokens)} prompt tokens, "
                                                f"{e.settings['method'].replace('_', ' ')}, seed {e.settings['seed']}"))
        if e.unknown_characters:
            chars = " ".join(repr(c) for c in e.unknown_characters[:10])
            frame.append("notes", m.note("unknown_characters", f"not in the vocabulary, shown as �: {chars}"))

    def _on_prefill(self, e, frame: Frame, run_id: int) -> None:
        self.status.pop("prefill", None)
        cached = f", {e.num_cached_tokens} from the prefix cache" if e.num_cached_tokens else ""
        frame.append("notes", macros().note("prefill", f"prefill ({e.model}): {e.num_tokens} tokens{cached} "
                                                       f"in {e.ms:.2f} ms", 0))
        self.lane = {"round": 0, "method": "prefill", "drafts": [], "final": None,
                     "why": "prefill: the first token comes from the target", "verdict": ""}

    def _on_prefill_progress(self, e, frame: Frame, run_id: int) -> None:
        """A chunk of a long prefill is done: the status and the draft lane show how far it is."""
        self.status["prefill"] = (e.num_computed, e.num_tokens)
        frame.replace["draft-lane"] = macros().lane_empty(
            f"Prefill ({e.model}) in chunks: {e.num_computed:,} of {e.num_tokens:,} prompt tokens done; the other "
            "sessions' steps run between the chunks (chunked prefill).")

    def _on_draft(self, e, frame: Frame, run_id: int) -> None:
        self.lane = {"round": e.round, "method": e.method, "final": None, "why": "", "verdict": "",
                     "drafts": [{"text": t["text"], "q": t["q"], "status": "unverified", "accept_prob": None,
                                 "r": None} for t in e.tokens]}

    def _on_token(self, e, frame: Frame, run_id: int) -> None:
        frame.append("stream", token_html(e))
        if e.status != "rejected":
            self.status["tokens"] += 1
        lane = self.lane
        if lane is None or lane["round"] != e.round:
            lane = self.lane = {"round": e.round, "method": "none", "drafts": [], "final": None, "verdict": "",
                                "why": "no draft: the target decodes one token"}
        if e.status in ("accepted", "rejected") and e.position <= len(lane["drafts"]):
            d = lane["drafts"][e.position - 1]
            d.update(status=e.status, accept_prob=e.accept_prob, r=e.r)
        else:
            lane["final"] = e

    def _on_round(self, e, frame: Frame, run_id: int) -> None:
        self.status["round"] = e.round
        frame.chart.append(f"{int(e.round)}:{e.target_ms:.3f}:{e.draft_ms:.3f}:{int(e.num_emitted)}:"
                           f"{int(e.num_draft_tokens)}:{int(e.num_accepted)}")
        lane = self.lane
        if lane is not None and lane["round"] == e.round:
            if lane["drafts"]:
                lane["verdict"] = (f"{e.num_accepted} of {e.num_draft_tokens} accepted"
                                   + (", bonus token" if e.num_accepted == e.num_draft_tokens else ", resampled")
                                   + f" · {e.verify_tokens} positions in one target forward")
            elif lane["method"] == "none" and self.form.get("method") == "ngram":
                lane["why"] = "no draft: the n-gram was not found earlier, the target decodes one token"
            frame.lane = lane

    def _on_kv(self, e, frame: Frame, run_id: int) -> None:
        frame.kv_events.append(e)

    def _on_metrics(self, e, frame: Frame, run_id: int) -> None:
        frame.metrics = e.values
        steps = e.values.get("verify_ms_by_tokens") or {}
        step = steps.get(1, steps.get("1"))
        if step and self.run_model_line is not None and "weights_stream_ms" in self.run_model_line[1]:
            frame.replace["model-info"] = macros().model_info(model_line(*self.run_model_line, step))
        self.status["tokens"] = e.values.get("num_output_tokens", self.status["tokens"])
        if self.status["gamma"] is not None or e.values.get("num_drafts"):
            self.status["gamma"] = e.values.get("num_speculative_tokens")
        if self.lane is not None and self.lane["round"] == 0 and self.lane["final"] is not None:
            frame.lane = self.lane

    def _on_settings_applied(self, e, frame: Frame, run_id: int) -> None:
        m = macros()
        round_ = self.status["round"] + 1
        if not e.changes:                     # settings an external engine cannot take: one line each
            for note in e.notes:
                frame.append("notes", m.note("settings_applied", note, round_))
            return
        text = ", ".join(setting_text(k, v) for k, v in e.changes.items())
        if "method" in e.changes:
            self.status["gamma"] = None if e.changes["method"] == "none" else self.status["gamma"]
        if "num_speculative_tokens" in e.changes:
            self.status["gamma"] = e.changes["num_speculative_tokens"]
        frame.append("stream", m.mark("settings_applied", "⚙ " + text, round_))
        cost = f" (cost {e.cost_ms:.1f} ms: {'; '.join(e.notes)})" if e.notes else ""
        frame.append("notes", m.note("settings_applied", f"{text} took effect{cost}", round_))

    def _on_done(self, e, frame: Frame, run_id: int) -> None:
        s = e.summary
        self.status.update(state="done", finish=s.get("finish_reason"), tokens=s["num_output_tokens"])
        clock = "as received from the engine" if self.external else "of engine time"
        parts = [f"{s['num_output_tokens']} tokens in {s['elapsed_s'] * 1e3:.0f} ms {clock}"]
        if s.get("tokens_per_s"):
            parts.append(f"{s['tokens_per_s']:.0f} tokens/s")
        if s.get("acceptance_rate") is not None:
            parts.append(f"acceptance rate {s['acceptance_rate']:.2f}" + (
                f", mean acceptance length {s['mean_acceptance_length']:.2f}"
                if s.get("mean_acceptance_length") is not None else ""))
        if s.get("target_forward_calls") is not None:
            parts.append(f"{s['target_forward_calls']} target forwards")
        if s.get("engine_tokens_per_s"):
            parts.append(f"{s['engine_tokens_per_s']:.0f} tokens/s by the engine's own clock")
        title = {"length": "Done: max tokens.", "stop": "Done: end of text.", "cancelled": "Stopped.",
                 "context": "Done: context full."}.get(s.get("finish_reason"), "Done.")
        frame.replace["summary"] = macros().summary({"title": title, "text": " · ".join(parts)})
        if s.get("server_metrics_moved"):      # an external engine's own /metrics, before and after this run
            moved = ", ".join(f"{k} +{v:g}" for k, v in s["server_metrics_moved"].items() if v)
            frame.append("notes", macros().note("server_metrics", f"the engine's /metrics during this run: {moved}"))
        frame.replace["run-recording"] = ""   # filled in once the recording is complete (render)
        frame.kv_snapshot = True          # the session's blocks are freed now: show it

    def _on_error(self, e, frame: Frame, run_id: int) -> None:
        self.status["state"] = "error"
        frame.replace["error"] = macros().error(e.message)
        frame.append("notes", macros().note("error", e.message))
        frame.replace["run-recording"] = ""
        frame.kv_snapshot = True

    def _on_other(self, e, frame: Frame, run_id: int) -> None:
        pass

    # --- gauges ------------------------------------------------------------------------------------
    def _render_gauges(self, values: dict, frame: Frame) -> None:
        """All gauges in one element (see templates/_fragments.html), the changed ones marked to animate."""
        texts = {name: fmt_metric(name, values.get(name)) for name in METRICS}
        changed = {name for name in METRICS if self.gauges.get(name) != texts[name]}
        if changed:
            self.gauges = texts
            rows = gauge_rows(texts, human_bytes(values.get("kv_cache_bytes")), changed)
            frame.replace["gauge-grid"] = macros().gauge_grid(rows)

    # --- the KV block map --------------------------------------------------------------------------
    def _engine_pool(self, key: tuple) -> dict | None:
        """The current state of a pool this view has drawn (after the session freed its blocks)."""
        engine = self.playground.engine
        for mgr in list(engine.managers.values()) if engine else []:
            if (mgr.pool.name, mgr.dtype.name, mgr.block_size) == key:
                pool = {"name": mgr.pool.name, "num_blocks": mgr.pool.num_blocks, "block_size": mgr.block_size,
                        "kv_cache_dtype": mgr.dtype.name, "bytes_per_token": mgr.bytes_per_token,
                        "used": mgr.pool.num_used_blocks, "block_table": [], "block_states": mgr.pool.block_states()}
                if self._snapshotting:
                    self.recording.snapshots[key] = pool       # a replay draws the pool as this page did
                return pool
        return None

    def _render_kv(self, frame: Frame) -> None:
        pools: dict[str, dict] = {}
        if frame.kv_events:
            # the drafter's pool (a draft model's, or an EAGLE head's own) is drawn in the draft slot, under its name
            pools = {("draft" if p["role"] == "eagle" else p["role"]): p for p in frame.kv_events[-1].pools}
        if frame.kv_snapshot or frame.kv_events:
            for role, old in self.kv.items():
                if role not in pools or frame.kv_snapshot:
                    snap = self._engine_pool(old.key)
                    if snap is not None and (role not in pools or frame.kv_snapshot):
                        pools[role] = snap
        last_event: dict[tuple, str] = {}
        for e in frame.kv_events:
            for be in e.events:
                last_event[(be["pool"], be["block_id"])] = be["kind"]
        m = macros()
        for role in ("target", "draft"):
            pool = pools.get(role)
            if pool is None:
                if role in self.kv or not self.kv:
                    why = (" (an external engine: its KV cache is the server's own, not shown here)" if self.external
                           else " (method: no drafter with a cache)" if role == "draft" else " (KV cache off: recomputing)")
                    frame.replace[f"kv-{role}-grid"] = m.kv_unused(role, f"No {role} KV cache in use" + why)
                    frame.replace[f"kv-{role}-caption"] = m.kv_caption(role, None)
                    self.kv.pop(role, None)
                continue
            key = (pool["name"], pool["kv_cache_dtype"], pool["block_size"])
            states, table = pool["block_states"], frozenset(pool["block_table"])
            old = self.kv.get(role)
            cells = []
            full = old is None or old.key != key
            for i, letter in enumerate(states):
                mine = i in table
                ev = last_event.get((pool["name"], i)) if not full else None
                if not full and ev is None and old.states[i] == letter and ((i in old.table) == mine):
                    continue
                if ev is None and not full and old.states[i] != letter:
                    ev = _transition(old.states[i], letter)
                cells.append({"id": i, "state": STATE_LETTERS[letter], "event": ev, "mine": mine})
            if full:
                frame.replace[f"kv-{role}-grid"] = kv_grid_html(role, pool, cells)
            elif cells:            # the changed segments whole, with this frame's events on the changed cells
                segments = sorted({c["id"] // KV_SEGMENT for c in cells})
                changed = {c["id"]: c for c in cells}
                cells = [changed.get(i) or {"id": i, "state": STATE_LETTERS[s], "event": None, "mine": i in table}
                         for i, s in enumerate(states)]
                if len(segments) > FULL_GRID_ABOVE:
                    frame.replace[f"kv-{role}-grid"] = kv_grid_html(role, pool, cells)
                else:
                    for k in segments:
                        segment = cells[k * KV_SEGMENT:(k + 1) * KV_SEGMENT]
                        frame.replace[f"kv-{role}-s{k}"] = kv_segment_html(role, k, segment, oob=True)
            if full or frame.kv_snapshot:      # not every round: each top-level element costs the browser
                frame.replace[f"kv-{role}-caption"] = m.kv_caption(role, pool)
            self.kv[role] = RenderedPool(key, states, table, pool)


def _transition(old: str, new: str) -> str | None:
    """The block event a change of state implies, when the engine reported none (e.g. after close)."""
    if new in "fc" and old in "us":
        return "free"
    if new == "u" and old in "fc":
        return "cache_hit" if old == "c" else "allocate"
    if new == "s":
        return "share"
    if new == "c" and old == "f":
        return "cache"
    return None
