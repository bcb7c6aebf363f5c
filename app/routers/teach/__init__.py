"""The teaching views' endpoints (`/teach/...`): HTML fragments htmx swaps into the views' panels, and the
JSON the views' scripts read (static/teach.js, static/theory.js).

| endpoint | what |
|---|---|
| `GET /teach/inspect` | the token inspector for one token of a recorded run (`recording`, `round`, `position`, `status`; `node` for a token tree's draft) |
| `GET /teach/recordings/{key}.json` | export: a run's settings and event stream (app/views/recording.py) |
| `GET /teach/recordings/{key}.html` | the run as one self-contained page that plays without a server (app/views/one_file_page.py) |
| `POST /teach/replays` | a recording (the JSON file) in, the page's messages for each of its rounds out (JSON) |
| `GET /teach/curve.json` | this machine's measured verify-cost curve t(n) of a model, and its draft's step |
| `POST /teach/distribution`, `GET /teach/distribution/{job}` | the first seed's distribution check, in the background |
| `GET /teach/memory` | the KV memory calculator on public configs |
| `GET /teach/paging`, `GET /teach/paging/live` | paging waste on the seed's request mix, and in the live pools |
| `GET /teach/cost` | measured verify cost here beside a roofline projection for an accelerator |
| `POST /teach/faults` | a teaching fault beside a correct run, with the point of divergence |
| `POST /teach/race` | the same prompt with one setting apart (`race`, `race_a`, `race_b`), on their engine clocks |
| `POST /teach/shootout`, `GET /teach/plain.json` | every method of the target, one after another (for SmolLM2, then our EAGLE head in vLLM); a recorded run against plain decoding |

One module a view. The routes translate: every figure comes from the engine (engine/experiments/theory.py,
engine/kv/memory.py, engine/experiments/traces.py, engine/experiments/race.py, engine/experiments/shootout.py, engine/experiments/measure.py). Errors are
answered with an error fragment and status 200, because htmx does not swap a 4xx answer.

NOTE: experiments started here (faults, race, shoot-out, the distribution check, a curve measurement) are
jobs on the one engine thread (engine/serving/jobs.py): their steps run between the scheduler's, so every other
session keeps generating. At most one of each kind runs at a time per process (common.py), so a room of
viewers cannot queue engine work here.
"""
from fastapi import APIRouter

from app.routers.teach import cost, distribution, faults, inspect, memory, paging, race, replay, shootout, theory

router = APIRouter(prefix="/teach", tags=["teach"])
for view in (inspect, replay, theory, distribution, memory, paging, cost, faults, race, shootout):
    router.include_router(view.router)
