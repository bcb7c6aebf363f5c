"""Small pieces of the page's text and HTML, as plain functions: a token, a prompt, a gauge's figure, a
setting, a size. The templates use them as filters and globals (registered once, in app/views/templating.py);
the views call them directly on their hot paths."""
from __future__ import annotations

import re

from markupsafe import Markup, escape

_WHITESPACE = {"\n": '<span class="ws" aria-hidden="true">↵</span>\n',
               "\t": '<span class="ws" aria-hidden="true">⇥</span>\t',
               "<|endoftext|>": '<span class="eos">⟨end of text⟩</span>'}
SETTING_LABELS = {"num_speculative_tokens": "γ", "kv_cache_dtype": "KV dtype", "num_kv_heads": "KV heads",
                  "enable_prefix_caching": "prefix caching", "kv_cache": "KV cache", "block_size": "block size",
                  "temperature": "temperature", "top_p": "top-p", "method": "method", "max_tokens": "max tokens",
                  "prompt_lookup_min": "n-gram min", "prompt_lookup_max": "n-gram max",
                  "num_speculative_tokens_schedule": "γ schedule", "rejection_sample_method": "verification",
                  "draft_confidence_threshold": "stop drafting below",
                  "suffix_decoding_max_tree_depth": "suffix depth", "suffix_decoding_max_cached_requests":
                  "suffix cached requests", "suffix_decoding_max_spec_factor": "suffix factor",
                  "suffix_decoding_min_token_prob": "suffix min prob"}


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
    whose weights do not fit in the caches: its step streams them all, engine/model/layout.py)."""
    floor = model.get("weights_stream_ms")
    if floor is None:
        return info
    on = f" on {model['threads']} threads" if model.get("threads", 1) > 1 else ""
    if step_ms is None:
        gb_s = model["weight_bytes"] / floor / 1e6
        return (f"{info} · its {model['weight_bytes'] / 1e6:.0f} MB of weights stream in {floor:.1f} ms here{on} "
                f"({gb_s:.0f} GB/s)")
    return (f"{info} · decode {step_ms:.1f} ms, weights stream in {floor:.1f} ms{on}: {floor / step_ms:.0%} of "
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


def iec(n) -> str:
    """Bytes in binary units: 147456 -> '144 KiB', 77309411328 -> '72 GiB'."""
    if n is None:
        return "–"
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.005 else f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def age(seconds: float) -> str:
    """How long ago, roughly: '12 s', '3 min', '2 h', '4 days'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def si_bytes(n) -> str:
    return "–" if n is None else f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def num(n, digits: int = 0) -> str:
    return "–" if n is None else f"{n:,.{digits}f}"


def pct(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}%"


def text_shown(text: str) -> Markup:
    """A text in a token stream: newlines and tabs made visible as the stream shows them."""
    return Markup("").join(piece(ch) if ch in "\n\t" else escape(ch) for ch in text)


def status_view(s: dict) -> dict:
    """The status line's state, label and detail, from a view's status (state, round, tokens, γ, finish)."""
    labels = {"idle": "Ready", "running": "Running", "paused": "Paused", "stopping": "Stopping",
              "done": "Done", "error": "Error"}
    detail = []
    if s["state"] == "queued":
        return {"state": "queued", "round": 0, "label": "Waiting",
                "detail": f"all slots busy: number {s.get('position')} in line"}
    prefill = s.get("prefill")                # (tokens computed, tokens, model) while prefilling in chunks
    if prefill:
        model = "" if prefill[2] == "target" else f" ({prefill[2]} model)"
        detail.append(f"prefill{model} {prefill[0]:,} of {prefill[1]:,} tokens")
    elif s["state"] != "idle":
        detail.append(f"round {s['round']}")
        detail.append(f"{s['tokens']} tokens")
        if s["gamma"] is not None and s["state"] != "done":
            detail.append(f"γ {s['gamma']}" + schedule_text(s.get("schedule")))
        if s["finish"]:
            detail.append({"length": "max tokens reached", "stop": "end of text", "cancelled": "stopped",
                           "context": "context full"}.get(s["finish"], s["finish"]))
    return {"state": s["state"], "round": s["round"], "label": labels.get(s["state"], s["state"]),
            "detail": " · ".join(detail), "run": s.get("run"),
            "prefill": prefill and f"{prefill[0]}/{prefill[1]}", "prefill_model": prefill and prefill[2]}


SCHEDULE_WHY = {"warmup": "warming up", "steady": "holding", "down": "lowered", "up": "raised",
                "probe": "probing whether speculation pays again"}


def schedule_text(state: dict | None) -> str:
    """What the `acceptance` or `batch` schedule's state (engine/spec_decode/schedule.py, batch_schedule.py,
    `report`) says of γ, in words."""
    if not state:
        return ""
    if state.get("schedule") == "batch":
        return batch_schedule_text(state)
    mean = state["mean_accepted"]
    average = "" if mean is None else f"{mean:.2f} draft tokens accepted a round (moving average)"
    if state["rounds_to_probe"] is not None:
        return (f" · speculation off: {average}, at most {state['off_below']:g}, so a verification costs more "
                f"than it saves; plain decode steps, a probe in {state['rounds_to_probe']} rounds")
    return f" ({SCHEDULE_WHY.get(state['why'], state['why'])}" + (f": {average})" if average else ")")


def batch_schedule_text(state: dict) -> str:
    n = state["batch_size"]
    sessions = f"{n} session{'s' * (n != 1)} on this model"
    if state["why"] == "unmeasured":
        return f" (by load: no table measured for this model and method, γ as set; {sessions})"
    start, end = state["range"]
    where = (f"{start} sessions or more" if n > end else f"{start}-{end} sessions" if end > start
             else f"{start} session{'s' * (start != 1)}")
    if state["why"] == "off":
        return (f" · speculation off: {sessions}, and at {where} the measured table ({state['measured']}) found "
                "no speculation fastest, as verification no longer pays at this load")
    return f" (by load: {sessions}, the table's γ for {where})"


def summary_text(s: dict, external: bool) -> tuple[str, str]:
    """A finished run's title and summary line, from its summary (`done`)."""
    clock = "as received from the engine" if external else "of engine time"
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
    return title, " · ".join(parts)


def model_info_text(md: dict, settings: dict, draft_model: dict | None) -> str:
    """The model line of a run: its model (ours, or an external engine) and its draft model."""
    external = bool(md.get("external"))
    if external:                # a server the operator configured (app/ws/external.py)
        threads = f", {md['threads']} thread(s)" if md.get("threads") else ""
        pub = md.get("published") or {}
        says = ", ".join(f"{k} {pub[k]}" for k in ("model_ftype", "n_ctx", "total_slots") if pub.get(k))
        info = (f"{md['name']}: an external engine ({md['engine']}{threads}); its KV cache dtype, KV heads, "
                "block map and drafter are set by the server at start-up"
                + (f" · the server says: {says}" if says else ""))
    else:
        info = (f"{md['name']}: {layers(md)} × width {md['hidden_size']}, {md['num_attention_heads']} query "
                f"heads, {md['num_key_value_heads']} KV heads ({md['attention']})")
    if draft_model and settings["method"] == "draft_model":
        dm = draft_model
        info += f" · draft model ({dm['name']}): {layers(dm)} × width {dm['hidden_size']}"
    return info


def started_text(e, external: bool) -> str:
    """The first note of a run: its prompt tokens (an external engine's as our tokenizer reads them with its
    chat template, where we have it; else the server counts them), method and seed."""
    n, seed = len(e.prompt_tokens), e.settings["seed"]
    if not external:
        return f"new run: {n} prompt tokens, {e.settings['method'].replace('_', ' ')}, seed {seed}"
    counted = f"{n} prompt tokens" if n else "the server tokenizes the prompt"
    return f"new run on {e.model['name']}: {counted}, seed {seed}"


def external_done_notes(s: dict, prompt_tokens_shown: int) -> list[tuple[str, str]]:
    """An external run's notes at its end: the server's prompt count where it differs from the one shown, how
    far its /metrics counters moved, vLLM's steps against its per-step lists."""
    notes = []
    if s.get("num_prompt_tokens") is not None and s["num_prompt_tokens"] != prompt_tokens_shown:
        shown = f" (shown: {prompt_tokens_shown}, our tokenizer's)" if prompt_tokens_shown else ""
        notes.append(("prompt_tokens", f"the server's prompt: {s['num_prompt_tokens']} tokens{shown}"))
    if s.get("server_metrics_moved"):
        moved = ", ".join(f"{k} +{v:g}" for k, v in s["server_metrics_moved"].items() if v)
        notes.append(("server_metrics", f"the engine's /metrics during this run: {moved}"))
    if s.get("vllm_rounds"):
        notes.append(("vllm_rounds", vllm_rounds_text(s["vllm_rounds"])))
    return notes


def vllm_rounds_text(r: dict) -> str:
    """The end of a vLLM run: do the stream's steps (a chunk each) and vLLM's per-step lists agree?"""
    own, stream = r.get("vllm"), r["stream"]
    head = (f"vLLM's per-step lists: {own['num_drafts']} steps with a draft, {own['num_draft_tokens']} drafted, "
            f"{own['num_accepted_tokens']} accepted" if own else "vLLM sent no per-step lists")
    said = (f"{head}; the stream: {r['chunks']} chunks, {stream['num_drafts']} steps with a draft, "
            f"{stream['num_accepted_tokens']} accepted — "
            + ("they agree" if r.get("agree") else "they differ" if r.get("agree") is False else "not compared"))
    return said + "".join(f"; {n}" for n in r["notes"])

