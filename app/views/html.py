"""`/ws`: the page's form messages in (htmx-ext-ws `ws-send`), HTML fragments out (swapped out-of-band by id).

Client messages are the playground form's fields as JSON (values as strings, a checkbox with its hidden
"false" twin as a list) plus `HEADERS`; buttons add `action` through `hx-vals`. A message without an
action is a change of the form: live settings go to the running session, the others apply next run.

Server messages: one per batch of items (coalesced), each top-level element with an `id` and
`hx-swap-oob`. Tokens are appended to #stream; the status, the draft lane, gauges and KV map segments are
replaced by id, and only their latest state in a batch is sent. docs/protocol.md lists every id.

NOTE (invariants): the view remembers per connection what it last rendered (gauge texts, the KV map:
app/views/kv_map.py) and sends only what changed. It renders from data only: the items, the
`RenderContext` and its `ViewSources`.
"""
from __future__ import annotations

from app.protocol import Batch, Command, CommandError, Notice, RenderContext, json_object, parse_speed
from app.views.fragments import (
    external_done_notes,
    fmt_metric,
    human_bytes,
    model_info_text,
    model_line,
    setting_text,
    started_text,
    status_view,
    summary_text,
    token_html,
)
from app.views.draft_lane import drafted, round_ended, token_verdict
from app.views.frame import Frame, ViewSources
from app.views.kv_map import KvMap
from app.views.model_options import model_note, model_options, target_of
from app.views.page import DEFAULT_SPEED, FORM_SETTINGS, GAUGES, form_field_value, gauge_rows, server_set
from app.views.race_pick import race_state, races_of
from app.views.recording import RECORDINGS
from app.views.templating import macros
from engine.external.server_metrics import server_gauges
from engine.serving.settings import LIVE_SETTINGS, excerpt, excerpt_name

METRICS = tuple(name for name, _, _ in GAUGES)
ACTIONS = ("toggle", "start", "step", "pause", "resume", "stop", "reset")

class HtmlView:
    default_speed = float(DEFAULT_SPEED)
    acks = True         # the page acknowledges what it has rendered ({"ack": n}, static/playground.js)

    def __init__(self, sources: ViewSources | None = None):
        self.sources = sources or ViewSources()
        self.form: dict = {}
        self.form_prompt: str | None = None
        self.kv = KvMap()
        self.gauges: dict[str, str | None] = {}
        self.server_gauges: list[dict] = []
        self.status = {"state": "idle", "round": 0, "tokens": 0, "gamma": None, "finish": None}
        self.lane: dict | None = None
        self.run_model_line: tuple[str, dict] | None = None     # the run's model line, and its model's figures
        self.run_id: int | None = None
        self.external = False           # the run is on an external engine (app/ws/external.py)
        self.prompt_tokens_shown = 0    # the run's prompt tokens its `started` carried
        self.recording = None           # the current run's events, kept for export, the inspector, replay
        self._recording_owner = False
        self._snapshotting = False
        self._ctx = RenderContext()

    # --- client messages -------------------------------------------------------------------------
    def parse(self, text: str, ctx: RenderContext) -> list[Command | Notice]:
        data = json_object(text, "expected the playground form as a JSON object")
        if data.keys() == {"ack"}:              # the page has rendered this many of our messages
            if not isinstance(data["ack"], int) or isinstance(data["ack"], bool):
                raise CommandError("ack: the number of messages rendered")
            return [Command("ack", ack=data["ack"])]
        data.pop("HEADERS", None)
        fields = {k: form_field_value(k, data[k]) for k in (*FORM_SETTINGS, "prompt", "speed", "action") if k in data}
        action = fields.pop("action", None)
        settings = {k: fields[k] for k in FORM_SETTINGS if k in fields}
        prompt = fields.get("prompt")
        speed = parse_speed(fields["speed"]) if "speed" in fields else "keep"
        if action in (None, "", "settings"):
            return self._form_changed(settings, prompt, speed, ctx)
        if action == "replay":
            # a replay is about to be swapped in (static/teach.js): end the run, forget what this view drew
            self.kv.clear()
            self.gauges.clear()
            return [Command("reset")]
        if action not in ACTIONS:
            raise CommandError(f"unknown action {excerpt(action)}; expected one of {', '.join(ACTIONS)}")
        if action in ("toggle", "start", "step") and prompt is not None:
            starting = action == "start" or ctx.state in ("idle", "done")
            if starting:
                self.form, self.form_prompt = settings, prompt
        return [Command(action, prompt=prompt, settings=settings, speed=speed)]

    def _form_changed(self, settings: dict, prompt: str | None, speed, ctx: RenderContext) -> list[Command | Notice]:
        old, self.form = self.form, settings
        old_prompt, self.form_prompt = self.form_prompt, prompt
        notices: list[Notice] = []
        commands = [Command("speed", speed=speed)] if speed != "keep" and speed != ctx.speed else []
        # the first message has no baseline: the page was rendered with the default model or the URL's
        if (settings.get("model") or "") != (old.get("model") or "") and self.sources.registry is not None:
            notices.append(Notice("model_options", {"model": settings.get("model") or None,
                                                    "num_kv_heads": settings.get("num_kv_heads")}))
        if ctx.state not in ("running", "paused"):
            return notices + commands
        changed = {k: v for k, v in settings.items() if old.get(k) != v}
        live = {k: v for k, v in changed.items() if k in LIVE_SETTINGS}
        for name in sorted(set(changed) - set(live)):
            value = excerpt_name(str(changed[name] or "–"))
            notices.append(Notice("note", {"kind": "next_run", "text": f"{name} = {value}: applies to the next run"}))
        if prompt is not None and old_prompt is not None and prompt != old_prompt:
            notices.append(Notice("note", {"kind": "next_run", "text": "the new prompt applies to the next run"}))
        if live:
            commands.append(Command("settings", settings=live))
        return notices + commands

    # --- server messages -------------------------------------------------------------------------
    def render(self, items: list, ctx: RenderContext) -> list[str]:
        m = macros()
        self._ctx = ctx
        frame = Frame()
        status_before = dict(self.status)
        current = ctx.run_id
        recording, was_complete = self.recording, self.recording is None or self.recording.complete
        for item in items:
            if isinstance(item, Notice):
                self._notice(item, frame)
            elif isinstance(item, Batch) and item.run_id == current:
                for event in item.events:
                    self._record(event)
                    getattr(self, "_on_" + event.type, self._on_other)(event, frame, item.run_id)
        # the run ended in this message: the pools drawn after it are kept with its recording
        self._snapshotting = self._recording_owner and self.recording.complete and (
            self.recording is not recording or not was_complete)
        if frame.kv_events or frame.kv_snapshot:
            self.kv.render(frame, self._pool_now, self.external)
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
        return status_view(self.status)

    # --- notices -----------------------------------------------------------------------------------
    def _notice(self, item: Notice, frame: Frame) -> None:
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
        elif item.type == "model_options" and d["model"] in self.sources.external:
            frame.replace["server-set"] = m.server_set(server_set(d["model"], self.sources.external,
                                                                  self.sources.registry))
        elif item.type == "model_options":
            frame.replace["server-set"] = m.server_set(server_set(None, ()))   # our model: every control applies
            opts = model_options(self.sources.registry, d["model"])
            value = d["num_kv_heads"] if d["num_kv_heads"] in {v["value"] for v in opts["variants"]} else ""
            frame.replace["f-num_kv_heads"] = m.kv_heads_select(opts, value)
            method = self.form.get("method") or opts["default_method"]
            available = {o["value"] for o in opts["methods"] if o["available"]}
            frame.replace["f-method"] = m.method_select(opts, method if method in available else opts["default_method"])
            frame.replace["f-chat"] = m.chat_checkbox(opts, self.form.get("chat") == "true")
            frame.append("notes", m.note("model", model_note(opts)))
            # the race offers what this model can do (static/teach.js keeps the page's race where it still can)
            target, engines = target_of(self.sources.registry, d["model"]), list(self.sources.external)
            frame.replace["race-pick"] = m.race_pick(races_of(self.sources.registry, target, engines),
                                                     race_state({}, self.sources.registry, target, [], engines))
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
        """Keep the run's events (app/views/recording.py): the first view of a run records it, the others (a room's
        watchers) refer to that recording."""
        if event.type == "started":
            self.recording, self._recording_owner = RECORDINGS.claim(event.session_id, self.form_prompt)
        if self.recording is not None and self._recording_owner:
            self.recording.add(event)

    def _on_started(self, e, frame: Frame, run_id: int) -> None:
        m = macros()
        self.run_id, self.lane = run_id, None
        self._render_server_gauges(None, frame)
        gamma = e.settings["num_speculative_tokens"] if e.settings["method"] != "none" else None
        # the run's id is part of its status: a run that ends as the one before did (same rounds and tokens,
        # rendered in one message by a watcher's broadcaster) still redraws the status as its own
        self.status = {"state": "paused" if self._ctx.paused else "running", "round": 0, "tokens": 0,
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
        info = model_info_text(e.model, e.settings, e.draft_model)
        self.run_model_line = (info, md)
        frame.replace["model-info"] = m.model_info(model_line(info, md, None))
        self.prompt_tokens_shown = len(e.prompt_tokens)
        frame.append("notes", m.note("started", started_text(e, self.external)))
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
        """A chunk of a long prefill is done: the status and the draft lane show how far it is. The last one
        (all computed) ends it: a draft model's catch-up, or a re-prefill, has no `prefill` event of its own."""
        if e.num_computed >= e.num_tokens:
            self.status.pop("prefill", None)
            return
        self.status["prefill"] = (e.num_computed, e.num_tokens, e.model)
        frame.replace["draft-lane"] = macros().lane_empty(
            f"Prefill ({e.model}) in chunks: {e.num_computed:,} of {e.num_tokens:,} prompt tokens done; the other "
            "sessions' steps run between the chunks (chunked prefill).")

    def _on_draft(self, e, frame: Frame, run_id: int) -> None:
        self.status.pop("prefill", None)          # decoding (recordings made before the last chunk was reported)
        self.lane = drafted(e)

    def _on_token(self, e, frame: Frame, run_id: int) -> None:
        self.status.pop("prefill", None)
        frame.append("stream", token_html(e))
        if e.status != "rejected":
            self.status["tokens"] += 1
        self.lane = token_verdict(self.lane, e, self.external)

    def _on_round(self, e, frame: Frame, run_id: int) -> None:
        self.status.pop("prefill", None)
        self.status["round"] = e.round
        frame.chart.append(f"{int(e.round)}:{e.target_ms:.3f}:{e.draft_ms:.3f}:{int(e.num_emitted)}:"
                           f"{int(e.num_draft_tokens)}:{int(e.num_accepted)}")
        if self.lane is not None and self.lane["round"] == e.round:
            round_ended(self.lane, e, self.external, self.form.get("method"))
            frame.lane = self.lane

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
            self.status["schedule"] = e.values.get("schedule_state")
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
        title, text = summary_text(s, self.external)
        frame.replace["summary"] = macros().summary({"title": title, "text": text, "elapsed_s": s.get("elapsed_s"),
                                                     "tokens": s["num_output_tokens"]})
        self._render_server_gauges(s.get("server_metrics"), frame)      # an external engine's own /metrics
        for kind, text in external_done_notes(s, self.prompt_tokens_shown) if self.external else ():
            frame.append("notes", macros().note(kind, text))
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
        if self.status["state"] != "done":      # then the server's figures after the run are shown (_on_done)
            self._render_server_gauges(values.get("server_metrics"), frame)
        texts = {name: fmt_metric(name, values.get(name)) for name in METRICS}
        draft = human_bytes(values.get("draft_kv_cache_bytes"))       # the draft pool's, beside the target's
        changed = {name for name in METRICS if self.gauges.get(name) != texts[name]}
        if changed or self.gauges.get("draft") != draft:
            self.gauges = {**texts, "draft": draft}
            rows = gauge_rows(texts, human_bytes(values.get("kv_cache_bytes")), changed, draft)
            frame.replace["gauge-grid"] = macros().gauge_grid(rows)

    def _render_server_gauges(self, series: dict | None, frame: Frame) -> None:   # None: no server's gauges
        if (rows := server_gauges(series) if series is not None else []) != self.server_gauges:
            self.server_gauges, frame.replace["server-gauges"] = rows, macros().server_gauges(rows)

    # --- the KV block map --------------------------------------------------------------------------
    def _pool_now(self, key: tuple) -> dict | None:
        """The current state of a pool this view has drawn (after the session freed its blocks)."""
        snap = next((p for p in self.sources.pools() if p.key == key), None)
        if snap is None:
            return None
        pool = snap.drawn()
        if self._snapshotting:
            self.recording.snapshots[key] = pool       # a replay draws the pool as this page did
        return pool
