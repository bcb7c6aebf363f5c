"""`POST /teach/distribution` starts the first seed's distribution check (engine/experiments/distribution.py) as an engine job;
`GET /teach/distribution/{job}` shows its progress, then its answer."""
from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import error_fragment, form_fields, fragment
from engine.experiments.distribution import distribution_steps
from engine.serving.settings import SettingsError

logger = logging.getLogger(__name__)
router = APIRouter()

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

    def settle(self, future) -> None:
        """The engine thread's answer (on the event loop)."""
        if future.cancelled():
            self.error = "the check was cancelled (the server is stopping)"
        elif future.exception() is not None:
            e = future.exception()
            logger.error("distribution check failed: %s: %s", type(e).__name__, e)
            self.error = str(e)
        else:
            self.result = future.result()

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


_jobs: OrderedDict[str, DistributionJob] = OrderedDict()
MAX_JOBS = 16


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
        steps = distribution_steps(playground.engine, prompt, samples, temperature, seed,
                                   lambda i, n: setattr(job, "done", i))
        playground.engine_thread.submit(steps).add_done_callback(job.settle)
    return fragment(request, "distribution", **distribution_view(job))


@router.get("/distribution/{job_id}", response_class=HTMLResponse)
def distribution_progress(request: Request, job_id: str) -> HTMLResponse:
    job = _jobs.get(job_id)
    if job is None:
        return error_fragment(request, "this check is no longer kept; run it again")
    if job.error:
        return error_fragment(request, job.error)
    return fragment(request, "distribution", **distribution_view(job))
