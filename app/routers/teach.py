"""The teaching views' endpoints (`/teach/...`): HTML fragments htmx swaps into the views' panels, and the
JSON the views' scripts read (static/teach.js).

| endpoint | what |
|---|---|
| `GET /teach/inspect` | the token inspector for one token of a recorded run (`recording`, `round`, `position`, `status`) |
| `GET /teach/recordings/{key}.json` | export: a run's settings and event stream (app/recording.py) |
| `POST /teach/replays` | a recording (the JSON file) in, the page's messages for each of its rounds out (JSON) |
| `GET /teach/curve.json` | this machine's measured verify-cost curve t(n) of a model, and its draft's step |
| `POST /teach/distribution`, `GET /teach/distribution/{job}` | the first seed's distribution check, in the background |
| `GET /teach/memory` | the KV memory calculator on public configs |
| `GET /teach/paging`, `GET /teach/paging/live` | paging waste on the seed's request mix, and in the live pools |
| `GET /teach/cost` | measured verify cost here beside a roofline projection for an accelerator |
| `POST /teach/faults` | a teaching fault beside a correct run, with the point of divergence |
| `POST /teach/race` | the same prompt with one setting apart (`race`, `race_a`, `race_b`), on their engine clocks |

The routes translate: every figure comes from the engine (engine/theory.py, engine/kv_memory.py,
engine/teaching.py, cli/generate.py's `check_distribution`, cli/bench_spec.py's `verify_curve`). Errors are
answered with an error fragment and status 200, because htmx does not swap a 4xx answer.

NOTE: runs started here (faults, race, the distribution check, a curve measurement) take one teaching slot
each: at most one at a time of each kind per process, so a room of viewers cannot queue engine work here.
"""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from markupsafe import Markup, escape

from app.deps import PlaygroundDep
from app.html_view import piece
from app.json_view import dumps
from app.page import FORM_SETTINGS
from app.recording import RECORDINGS, Recording, RecordingError
from app.replay import replay_frames
from app.templating import templates
from engine.measure import check_distribution, curve_at, verify_curve
from engine.kv_dtypes import KV_CACHE_DTYPES, kv_bytes_per_token
from engine.kv_memory import ELEMENT_BYTES, PUBLIC_CONFIGS, calculator, paging_waste, seed_request_mix
from engine.layout import stream_ms, weight_bytes
from engine.registry import SEQUENCE_TOKENS_BUDGET
from engine.settings import FAULTS, GenerationSettings, SettingsError
from engine.race import RACE_SETTINGS, race
from engine.teaching import fault_comparison
from engine.theory import (ACCELERATORS, expected_tokens_per_round, projected_speedup, projected_verify_curve,
                           speedup_from_curve)

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/teach", tags=["teach"])

MAX_RECORDING_BYTES = 32 * 2 ** 20
MAX_FORM_BYTES = 64 * 1024
FAULT_MAX_TOKENS = 64
RACE_MAX_TOKENS = 512
CURVE_NS = tuple(range(1, 18))                      # verify sizes: gamma + 1 for gamma up to 16
LARGE_MODEL_PARAMS = 20e6                           # beyond this a curve is measured at fewer sizes, once


# --- formatting (Jinja filters for the teaching templates) ---------------------------------------------
def iec(n) -> str:
    """Bytes in binary units: 147456 -> '144 KiB', 77309411328 -> '72 GiB'."""
    if n is None:
        return "–"
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.005 else f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def si_bytes(n) -> str:
    return "–" if n is None else f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def num(n, digits: int = 0) -> str:
    return "–" if n is None else f"{n:,.{digits}f}"


def pct(x, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}%"


def text_shown(text: str) -> Markup:
    """A text in a token stream: newlines and tabs made visible as the stream shows them."""
    return Markup("").join(piece(ch) if ch in "\n\t" else escape(ch) for ch in text)


# (`shown`, for a token standing alone, is app/html_view.py's)
templates.env.filters.update(iec=iec, si_bytes=si_bytes, num=num, pct=pct, text_shown=text_shown)


def fragment(request: Request, name: str, **context) -> HTMLResponse:
    return templates.TemplateResponse(request, f"teach/{name}.html", context)


def error_fragment(request: Request, message: str) -> HTMLResponse:
    return fragment(request, "error", message=message)


class Slot:
    """At most one job of a kind at a time (non-blocking: a second one is told to wait)."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            raise BusyError()
        return self

    def __exit__(self, *exc):
        self._lock.release()


class BusyError(RuntimeError):
    pass


RUN_SLOT = Slot()          # faults and race
CURVE_SLOT = Slot()


async def form_fields(request: Request) -> dict:
    """A form as htmx sends it (url-encoded): text values, the last of repeated names (a checkbox and its
    hidden twin). Parsed here: starlette's form parser needs python-multipart, which nothing else needs."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise SettingsError("form", f"at most {MAX_FORM_BYTES // 1024} KiB")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def form_settings(fields: dict) -> dict:
    return {k: fields[k] for k in FORM_SETTINGS if k in fields}


# --- token inspector ------------------------------------------------------------------------------------
@router.get("/inspect", response_class=HTMLResponse)
def inspect(request: Request, recording: str, round: int, position: int, status: str) -> HTMLResponse:
    rec = RECORDINGS.get(recording)
    if rec is None:
        return error_fragment(request, "This run is no longer kept on the server (it keeps the most recent runs). "
                                       "Run it again, or replay its exported file.")
    settings = rec.settings
    ctx = {"round": round, "position": position, "status": status, "settings": settings,
           "greedy": settings.get("temperature", 0) == 0, "token": None, "draft_token": None, "replaced": None,
           "rejected": None}
    if status == "unverified":
        draft = rec.draft(round)
        if draft is None or not 1 <= position <= len(draft.tokens):
            return error_fragment(request, f"no draft token at round {round}, position {position}")
        ctx["draft_token"] = draft.tokens[position - 1]
    else:
        tok = rec.token(round, position, status)
        if tok is None:
            return error_fragment(request, f"no {status} token at round {round}, position {position}")
        ctx["token"] = tok
        if status == "rejected":
            ctx["replaced"] = rec.token(round, position, "resampled")
        if status == "resampled":
            ctx["rejected"] = rec.token(round, position, "rejected")
    return fragment(request, "inspector", **ctx)


# --- record / replay --------------------------------------------------------------------------------------
@router.get("/recordings/{key}.json")
def export_recording(key: str) -> Response:
    rec = RECORDINGS.get(key)
    if rec is None:
        return JSONResponse({"error": "this run is no longer kept on the server"}, status_code=404)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(rec.created))
    return Response(dumps(rec.to_json()), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="decoding-playground-{stamp}-{key[:8]}.json"'})


@router.post("/replays")
async def load_replay(request: Request) -> JSONResponse:
    """The body is a recording file; the answer holds the page's messages for each of its rounds."""
    body = await request.body()
    if len(body) > MAX_RECORDING_BYTES:
        return JSONResponse({"error": f"file too large: at most {MAX_RECORDING_BYTES // 2 ** 20} MiB"}, status_code=413)
    try:
        data = json.loads(body)
        name = (request.headers.get("x-file-name") or "")[:120] or None
        rec = Recording.from_json(data, name=name)
    except (ValueError, RecordingError) as e:
        return JSONResponse({"error": f"cannot replay this file: {e}"}, status_code=400)
    try:
        frames = await anyio.to_thread.run_sync(replay_frames, rec)
    except Exception as e:  # noqa: BLE001 - a file with events of the right names but wrong contents
        logger.info("replay of %s failed: %s: %s", rec.key, type(e).__name__, e)
        return JSONResponse({"error": f"cannot replay this file: its events do not render ({type(e).__name__})"},
                            status_code=400)
    rec = RECORDINGS.put(rec)
    started = rec.started
    return JSONResponse({"key": rec.key, "name": rec.name, "frames": frames, "rounds": rec.num_rounds,
                         "complete": rec.complete, "settings": rec.settings,
                         "model": started.model.get("name") if started else None})


# --- measured verify-cost curve ----------------------------------------------------------------------------
_curves: dict[str, dict] = {}


def measured_curve(engine, model_name: str | None) -> dict:
    """t(n) of one target forward over n new tokens (ms, 100-token context) and one draft step, measured once
    per model on this machine (under the engine lock: no generation runs meanwhile)."""
    lm = engine.registry.get(model_name)
    if lm.name in _curves:
        return _curves[lm.name]
    with CURVE_SLOT, engine.lock:
        if lm.name in _curves:
            return _curves[lm.name]
        large = lm.model.num_parameters > LARGE_MODEL_PARAMS
        ns = (1, 2, 3, 5, 9, 17) if large else CURVE_NS
        repeats = 2 if large else 11
        t = time.perf_counter()
        # the fastest of the repeats: on a shared machine (the browser, other viewers) interference only adds time
        curve = verify_curve(lm, ns=ns, repeats=repeats, summary=min)
        draft = engine.registry.draft_for(lm)
        draft_ms = verify_curve(draft, ns=(1,), repeats=repeats, summary=min)[1] if draft is not None else None
        # a model whose weights do not fit in the caches: one pass over its weight bytes, the floor of t(1)
        streamed = hasattr(lm.model, "weights_stream_ms")
        result = {"model": lm.name, "draft": draft.name if draft else None, "context": 100,
                  "target_ms": {n: curve_at(curve, n) for n in CURVE_NS}, "measured_at": list(ns),
                  "draft_ms": draft_ms, "c": draft_ms / curve[1] if draft_ms else None,
                  "floor_ms": stream_ms(lm.model) if streamed else None,
                  "weight_bytes": weight_bytes(lm.model) if streamed else None,
                  "seconds": time.perf_counter() - t}
        _curves[lm.name] = result
        return result


def model_of(playground, recording: str | None, model: str | None) -> str | None:
    """The target a view is about: the recorded run's, else the form's (None: the default target)."""
    rec = RECORDINGS.get(recording) if recording else None
    if rec is not None and rec.started is not None:
        return rec.started.model.get("name")
    return model or None


@router.get("/curve.json")
async def curve_json(playground: PlaygroundDep, model: str | None = None, recording: str | None = None):
    if playground.engine is None:
        return JSONResponse({"error": playground.load_error or "no models loaded"}, status_code=503)
    try:
        name = model_of(playground, recording, model)
        return JSONResponse(await anyio.to_thread.run_sync(measured_curve, playground.engine, name))
    except KeyError as e:
        return JSONResponse({"error": str(e.args[0])}, status_code=404)
    except BusyError:
        return JSONResponse({"error": "busy: another curve is being measured; try again in a moment"},
                            status_code=503)


# --- distribution check ------------------------------------------------------------------------------------
SEED_PREFIXES = [("import ", 0.8987, 0.8991, 0.0067, 0.0056, 0.1000),
                 ("    return self.", 0.8697, 0.8706, 0.0051, 0.0045, 0.1304),
                 ("        if not ", 0.8610, 0.8609, 0.0062, 0.0058, 0.1389)]
SAMPLE_CHOICES = (20_000, 50_000, 200_000)


@dataclass
class DistributionJob:
    id: str
    params: tuple               # (prompt, temperature, samples, seed)
    done: int = 0
    result: dict | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def total(self) -> int:
        return self.params[2]

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


_jobs: OrderedDict[str, DistributionJob] = OrderedDict()
_jobs_lock = threading.Lock()
MAX_JOBS = 16


def _run_distribution(job: DistributionJob, engine) -> None:
    prompt, temperature, samples, seed = job.params
    try:
        job.result = check_distribution(engine, prompt, samples, temperature, seed,
                                         lambda i, n: setattr(job, "done", i))
    except Exception as e:  # noqa: BLE001 - reported on the page
        logger.exception("distribution check failed")
        job.error = str(e)


def distribution_view(job: DistributionJob) -> dict:
    r = job.result
    if r is None:
        return {"job": job}
    top = r["top_tokens"]
    other = {k: max(0.0, 1 - sum(t[k] for t in top)) for k in ("p", "q", "speculative", "direct", "draft_only")}
    peak = max(max(t[k] for k in ("p", "speculative", "direct", "draft_only")) for t in top)
    seed_row = next((s for s in SEED_PREFIXES if s[0] == r["prompt"]), None)
    return {"job": job, "r": r, "top": top, "peak": peak, "other": other, "seed_row": seed_row}


@router.post("/distribution", response_class=HTMLResponse)
async def start_distribution(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        fields = await form_fields(request)
        prompt = fields.get("prefix", "")
        if not prompt or len(prompt) > 200:
            raise SettingsError("prefix", "1 to 200 characters")
        temperature = float(fields.get("sample_temperature", "1"))
        if not 0 < temperature <= 2:
            raise SettingsError("temperature", "the check needs sampling: 0 < temperature <= 2")
        samples = int(fields.get("samples", "200000"))
        if not 1000 <= samples <= 200_000:
            raise SettingsError("samples", "1,000 to 200,000")
        seed = int(fields.get("sample_seed", "0"))
        if not 0 <= seed < 2 ** 32:
            raise SettingsError("seed", "0 to 2^32 - 1")
    except (ValueError, SettingsError) as e:
        return error_fragment(request, str(e))
    params = (prompt, temperature, samples, seed)
    with _jobs_lock:
        same = next((j for j in _jobs.values() if j.params == params and not j.error), None)
        running = next((j for j in _jobs.values() if not j.finished), None)
        if same is not None:
            job = same                                 # the same check again: its answer, or its progress
        elif running is not None:
            return error_fragment(request, f"Another check is running ({running.done * 100 // running.total}% "
                                           "done): try again in a few seconds.")
        else:
            job = DistributionJob(secrets.token_hex(8), params)
            _jobs[job.id] = job
            while len(_jobs) > MAX_JOBS:
                _jobs.popitem(last=False)
            threading.Thread(target=_run_distribution, args=(job, playground.engine), daemon=True,
                             name=f"distribution-{job.id}").start()
    return fragment(request, "distribution", **distribution_view(job))


@router.get("/distribution/{job_id}", response_class=HTMLResponse)
def distribution_progress(request: Request, job_id: str) -> HTMLResponse:
    job = _jobs.get(job_id)
    if job is None:
        return error_fragment(request, "this check is no longer kept; run it again")
    if job.error:
        return error_fragment(request, job.error)
    return fragment(request, "distribution", **distribution_view(job))


def _number(text: str, default, kind=float, low=None, high=None):
    """A query value as the page sends it (possibly empty): parsed, clamped, or the default."""
    try:
        value = kind(text)
    except (TypeError, ValueError):
        return default
    if value != value:           # NaN
        return default
    return min(max(value, low), high)


# --- KV memory calculator -------------------------------------------------------------------------------
MEMORY_PRESETS = [
    {"label": "Qwen3-8B, 32,768 tokens × 16 sequences", "note": "first seed: 72 GiB",
     "values": {"config": "Qwen3-8B", "context": 32768, "sequences": 16, "dtype": "bfloat16", "draft": ""}},
    {"label": "Llama-3.1-8B + Llama-3.2-1B draft, 8,192 tokens, fp16", "note": "second seed: 1 GiB + 256 MiB",
     "values": {"config": "Llama-3.1-8B", "context": 8192, "sequences": 1, "dtype": "float16",
                "draft": "Llama-3.2-1B"}},
    {"label": "gpt-oss-20b, 131,072 tokens", "note": "first seed: ≈ 3.0 GiB (sliding layers hold 128)",
     "values": {"config": "gpt-oss-20b", "context": 131072, "sequences": 1, "dtype": "bfloat16", "draft": ""}},
    {"label": "Qwen2.5-72B-Instruct, 32,768 tokens × 8", "note": "",
     "values": {"config": "Qwen2.5-72B-Instruct", "context": 32768, "sequences": 8, "dtype": "bfloat16",
                "draft": ""}},
]
MEMORY_DTYPES = ["bfloat16", "float16", "fp8_e4m3", "int8_per_token_head", "float32"]


@router.get("/memory", response_class=HTMLResponse)
def memory(request: Request, playground: PlaygroundDep, config: str = "Qwen3-8B", context: str = "32768",
           sequences: str = "16", dtype: str = "bfloat16", draft: str = "") -> HTMLResponse:
    """The form's names are not the generation settings' (`config`, `dtype`): the page has its own `model`."""
    model, kv_cache_dtype = config, dtype
    problems = []
    if model not in PUBLIC_CONFIGS:
        problems.append(f"model: one of {', '.join(PUBLIC_CONFIGS)}")
        model = "Qwen3-8B"
    if draft and draft not in PUBLIC_CONFIGS:
        problems.append(f"draft: one of {', '.join(PUBLIC_CONFIGS)}")
        draft = ""
    if kv_cache_dtype not in MEMORY_DTYPES:
        problems.append(f"kv_cache_dtype: one of {', '.join(MEMORY_DTYPES)}")
        kv_cache_dtype = "bfloat16"
    n = _number(context, None, int, 1, 1_048_576)
    if n is None or str(n) != context.strip():
        problems.append("context: 1 to 1,048,576 tokens")
    context = n or 32768
    n = _number(sequences, None, int, 1, 4096)
    if n is None or str(n) != sequences.strip():
        problems.append("sequences: 1 to 4,096")
    sequences = n or 1
    r = calculator(model, context, sequences, kv_cache_dtype, draft or None)
    cfg = PUBLIC_CONFIGS[model]
    eb = ELEMENT_BYTES[kv_cache_dtype]
    weights = cfg.parameters * 2
    total = weights + r["kv_bytes"] + r.get("draft_weight_bytes", 0) + r.get("draft_kv_bytes", 0)
    ours = []
    if playground.registry is not None:
        dtype = "auto" if kv_cache_dtype == "float32" else kv_cache_dtype
        for lm in playground.registry.targets:
            c = lm.cfg
            ours.append({"name": lm.name, "layers": c.num_hidden_layers, "kv_heads": c.num_key_value_heads,
                         "head_dim": c.head_dim, "dtype": KV_CACHE_DTYPES[dtype],
                         "bytes_per_token": kv_bytes_per_token(c, dtype)})
    return fragment(request, "memory", r=r, cfg=cfg, element_bytes=eb, weights=weights, total=total,
                    configs=PUBLIC_CONFIGS, dtypes=MEMORY_DTYPES, presets=MEMORY_PRESETS, problems=problems,
                    accelerators=ACCELERATORS.values(), ours=ours, draft_cfg=PUBLIC_CONFIGS.get(draft))


# --- paging waste ----------------------------------------------------------------------------------------
SEED_WASTE = {None: 0.472, 16: 0.007, 32: 0.014}


@router.get("/paging", response_class=HTMLResponse)
def paging(request: Request) -> HTMLResponse:
    lengths = seed_request_mix()
    rows = [{"block_size": b, "ours": paging_waste(lengths, b), "seed": SEED_WASTE.get(b)} for b in (None, 8, 16, 32)]
    sample = [int(x) for x in lengths[:24]]
    return fragment(request, "paging", rows=rows, sample=sample, n=len(lengths), low=int(lengths.min()),
                    high=int(lengths.max()), mean=float(lengths.mean()))


def live_pools(engine) -> list[dict]:
    """Every KV pool of the engine now: the sequences it holds, their tokens, and the waste of their blocks
    beside what preallocating each sequence's whole context would have wasted."""
    out = []
    with engine.lock:
        managers = list(engine.managers.values())
        snapshot = [(m, [s.num_tokens for s in m.sequences.values() if s.num_tokens]) for m in managers]
    for mgr, lengths in snapshot:
        ctx = min(mgr.cfg.max_position_embeddings, SEQUENCE_TOKENS_BUDGET)
        bs = mgr.block_size
        out.append({"name": mgr.pool.name, "kv_cache_dtype": mgr.dtype.name, "block_size": bs,
                    "sequences": len(lengths), "tokens": sum(lengths), "context": ctx,
                    "slots": sum(-(-n // bs) * bs for n in lengths),
                    "paged": paging_waste(lengths, bs, ctx) if lengths else None,
                    "prealloc": paging_waste(lengths, None, ctx) if lengths else None})
    return out


def run_paging(rec: Recording | None) -> dict | None:
    """The recorded run's own sequence at its last round: tokens held and the blocks they took."""
    if rec is None:
        return None
    kv, metrics = rec.last("kv"), rec.last("metrics")
    pool = next((p for p in (kv.pools if kv else []) if p.get("role") == "target"), None)
    if pool is None or metrics is None or not metrics.values.get("kv_bytes_per_token"):
        return None
    held = metrics.values["kv_cache_bytes"] // metrics.values["kv_bytes_per_token"]
    slots = len(pool["block_table"]) * pool["block_size"]
    ctx = rec.started.model.get("max_position_embeddings") or 0
    return {"tokens": held, "blocks": len(pool["block_table"]), "block_size": pool["block_size"], "slots": slots,
            "paged": 1 - held / slots if slots else None, "context": ctx,
            "prealloc": 1 - held / ctx if ctx else None, "complete": rec.complete}


@router.get("/paging/live", response_class=HTMLResponse)
def paging_live(request: Request, playground: PlaygroundDep, recording: str = "") -> HTMLResponse:
    pools = live_pools(playground.engine) if playground.engine else []
    rec = RECORDINGS.get(recording) if recording else None
    return fragment(request, "paging_live", pools=pools, run=run_paging(rec))


# --- cost model: here vs an accelerator -----------------------------------------------------------------------
BATCHES = (1, 4, 16, 64, 256, 1024)
PROJECTION_DRAFT = "Llama-3.2-1B"


@router.get("/cost", response_class=HTMLResponse)
async def cost(request: Request, playground: PlaygroundDep, model: str = "", recording: str = "",
               accelerator: str = "H100-SXM", target: str = "Llama-3.1-8B", alpha: str = "", gamma: str = "",
               batch: str = "", context: str = "") -> HTMLResponse:
    """`alpha` and `gamma` default to the page's run (static/teach.js fills them in), else 0.8 and 4."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    alpha = _number(alpha, 0.8, float, 0.0, 0.99)
    gamma = _number(gamma, 4, int, 1, 16)
    batch = _number(batch, 1, int, 1, 4096)
    context = _number(context, 512, int, 1, 131072)
    accelerator = accelerator if accelerator in ACCELERATORS else "H100-SXM"
    target = target if target in PUBLIC_CONFIGS and target != PROJECTION_DRAFT else "Llama-3.1-8B"
    try:
        here = await anyio.to_thread.run_sync(measured_curve, playground.engine, model_of(playground, recording, model))
    except KeyError as e:
        return error_fragment(request, str(e.args[0]))
    except BusyError:
        return error_fragment(request, "Another verify-cost curve is being measured: try again in a moment.")
    t1 = here["target_ms"][1]
    ratio_here = {n: ms / t1 for n, ms in here["target_ms"].items()}
    e = expected_tokens_per_round(alpha, gamma)
    c_here = here["c"] or 0.0
    tcfg, dcfg = PUBLIC_CONFIGS[target], PUBLIC_CONFIGS[PROJECTION_DRAFT]

    def project(acc, b):
        return projected_speedup(acc, alpha, gamma, tcfg.parameters, dcfg.parameters, tcfg.bytes_per_token(2, context),
                                 dcfg.bytes_per_token(2, context), context, batch=b)

    projections = []
    for key, acc in ACCELERATORS.items():
        curve = projected_verify_curve(acc, tcfg.parameters, tcfg.bytes_per_token(2, context), context, CURVE_NS, batch)
        projections.append({"key": key, "acc": acc, "curve": curve, "p": project(acc, batch),
                            "by_batch": [project(acc, b) for b in BATCHES]})
    chosen = next(p for p in projections if p["key"] == accelerator)
    return fragment(request, "cost", here=here, ratio_here=ratio_here, e=e, alpha=alpha, gamma=gamma, batch=batch,
                    context=context, c_here=c_here,
                    speedup_here=speedup_from_curve(alpha, gamma, c_here, ratio_here[gamma + 1]),
                    projections=projections, chosen=chosen, accelerator=accelerator, accelerators=ACCELERATORS,
                    target=target, targets=[n for n in PUBLIC_CONFIGS if n != PROJECTION_DRAFT],
                    draft_name=PROJECTION_DRAFT, batches=BATCHES, ns=CURVE_NS,
                    **y_axis(max(max(ratio_here.values()), *(max(p["curve"].values()) for p in projections))))


def y_axis(top: float) -> dict:
    """A chart's maximum and ticks in round numbers (1, 2 or 5 times a power of ten apart)."""
    for step in (0.5, 1, 2, 5, 10, 20, 50):
        if top * 1.08 / step <= 5:
            break
    ymax = step * -(-top * 1.08 // step)
    ticks = [step * i for i in range(1, int(ymax / step) + 1)]
    return {"ymax": ymax, "yticks": ticks if 1 in ticks else [1, *ticks]}


# --- faults and race ---------------------------------------------------------------------------------------
FAULT_TEXT = {
    "no_causal_mask": {
        "title": "No causal mask in verification",
        "seed": "no causal mask in verify -> max|logit diff| 0.982, argmax same False",
        "why": "Verification feeds the last token and the γ draft tokens through the target in one forward. "
               "Without the causal mask, position i also attends to the draft tokens after it: the target's "
               "distribution at each position is computed from the future, so acceptance is decided on the wrong "
               "p. Greedy speculative decoding should equal plain greedy decoding token for token; with this fault "
               "it parts from it."},
    "no_truncate": {
        "title": "Forgetting to truncate the cache",
        "seed": "forgot truncate -> same as reference: False, first diff at 4",
        "why": "After a rejection, the K/V the target wrote for the rejected draft tokens must be dropped: "
               "truncate the cache (here: the block table) to the accepted length. Kept, they sit in the cache "
               "as if they were part of the text; every later token attends to them, and positions shift."},
    "unnormalized_residual": {
        "title": "Unnormalised residual",
        "seed": "unnormalized p -> ValueError: Probabilities do not sum to 1.",
        "why": "After a rejection, the replacement is drawn from max(0, p − q), which must be normalised to "
               "sum to 1. Without it, numpy refuses at the first rejection — the error the first seed hit while "
               "writing its experiment. (It needs sampling: greedy verification never draws from the residual.)"},
}


def _teaching_run(func, *args):
    with RUN_SLOT:
        return func(*args)


async def _settings_from(request: Request) -> tuple[str, dict, dict]:
    fields = await form_fields(request)
    return fields.get("prompt", ""), form_settings(fields), fields


@router.post("/faults", response_class=HTMLResponse)
async def faults(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        prompt, settings, fields = await _settings_from(request)
        fault = fields.get("fault", "")
        if fault not in FAULTS or fault == "none":
            raise SettingsError("fault", f"one of {', '.join(FAULT_TEXT)}")
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, FAULT_MAX_TOKENS)
        r = await anyio.to_thread.run_sync(_teaching_run, fault_comparison, playground.engine, prompt, settings, fault)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison or race is running: try again in a moment.")
    emitted = {role: [t for t in r[role]["tokens"] if t["status"] != "rejected"] for role in ("reference", "faulty")}
    return fragment(request, "faults", r=r, text=FAULT_TEXT[fault], emitted=emitted, prompt=prompt)


@router.post("/race", response_class=HTMLResponse)
async def race_view(request: Request, playground: PlaygroundDep) -> HTMLResponse:
    """`race` names the setting the two sides differ in, `race_a` and `race_b` its values (engine/race.py)."""
    if playground.engine is None:
        return error_fragment(request, playground.load_error or "no models loaded")
    try:
        prompt, settings, fields = await _settings_from(request)
        setting = fields.get("race") or "method"
        if setting not in RACE_SETTINGS:
            raise SettingsError("race", f"one of {', '.join(RACE_SETTINGS)}")
        values = (fields["race_a"], fields["race_b"]) if fields.get("race_a") and fields.get("race_b") else None
        settings["max_tokens"] = min(GenerationSettings.parse(settings).max_tokens, RACE_MAX_TOKENS)
        r = await anyio.to_thread.run_sync(_teaching_run, race, playground.engine, prompt, settings, setting, values)
    except (SettingsError, ValueError) as e:
        return error_fragment(request, str(e))
    except BusyError:
        return error_fragment(request, "Another comparison or race is running: try again in a moment.")
    return fragment(request, "race", r=r, prompt=prompt)
