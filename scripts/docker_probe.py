"""What `make docker-check` asks of the started image, as a client outside it: run in the image's network
namespace (nsenter), where the server listens on the image's port and only loopback exists.

    python scripts/docker_probe.py http://127.0.0.1:8000 [--model smollm2-135m]

Checks /healthz, the page and the two front-end files it loads, /api/models, and one generation over
/api/ws (with the page's own Origin, as a browser sends it) per model named; prints one line per check and
exits 1 on the first failure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import urllib.error
import urllib.request

import websockets

START_TIMEOUT_S = 60.0         # the image's HEALTHCHECK gives it 30 s start period; we are on a busy machine
GENERATION_TIMEOUT_S = 180.0   # SmolLM2's first use reads and fuses 540 MB of weights


def get(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.headers.get("content-type", ""), response.read()


def wait_healthy(base: str) -> float:
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < START_TIMEOUT_S:
        try:
            status, _, body = get(f"{base}/healthz", timeout=2)
            if status == 200 and json.loads(body) == {"status": "ok"}:
                return time.monotonic() - t0
            last = f"{status} {body[:200]!r}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            last = repr(error)
        time.sleep(0.2)
    raise AssertionError(f"/healthz not ok after {START_TIMEOUT_S:.0f} s: {last}")


def check_page(base: str) -> str:
    status, ctype, body = get(f"{base}/")
    page = body.decode()
    assert status == 200 and ctype.startswith("text/html"), (status, ctype)
    scripts = re.findall(r'<script[^>]+src="([^"]+)"', page)
    vendored = [s for s in scripts if s.rsplit("/", 1)[-1].split("?")[0] in ("htmx.min.js", "ws.js")]
    assert len(vendored) == 2, f"the page should load htmx.min.js and ws.js, its scripts: {scripts}"
    for src in vendored:                         # copied from the Node stage: present and non-empty
        s_status, _, s_body = get(base + src if src.startswith("/") else f"{base}/{src}")
        assert s_status == 200 and len(s_body) > 1000, (src, s_status, len(s_body))
    return f"{len(page)} bytes of HTML, {', '.join(vendored)} served"


async def generate(base: str, model: str | None) -> dict:
    url = base.replace("http://", "ws://") + "/api/ws"
    settings = {"max_tokens": 12, "seed": 7}
    if model:             # a fetched model has no draft model of its vocabulary: n-gram drafts
        settings.update(model=model, method="ngram")
    async with websockets.connect(url, origin=base, open_timeout=10, max_size=2 ** 22) as ws:
        await ws.send(json.dumps({"type": "start", "prompt": "def main(argv):\n    ", "settings": settings}))
        seen = []
        while True:
            message = json.loads(await ws.recv())
            seen.append(message["type"])
            assert message["type"] != "error", message
            if message["type"] == "done":
                events = [t for t in seen if t != "note"]      # a note may come first ("loading the weights")
                assert events[0] == "started" and "token" in events, seen[:10]
                assert message["num_output_tokens"] >= 1 and message["text"], message["text"]
                return message


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url")
    parser.add_argument("--model", action="append", default=[], help="also generate with this model")
    args = parser.parse_args(argv)
    base = args.base_url.rstrip("/")

    def check(name, fn):
        t0 = time.monotonic()
        try:
            detail = fn()
        except Exception as error:          # any failure is this check's: say which, then stop
            print(f"docker-check: FAIL {name}: {error!r}", flush=True)
            raise SystemExit(1)
        print(f"docker-check: ok   {name} ({time.monotonic() - t0:.1f} s): {detail}", flush=True)

    check("/healthz", lambda: f'{{"status": "ok"}} after {wait_healthy(base):.1f} s')
    check("/", lambda: check_page(base))
    listed = {}
    check("/api/models", lambda: listed.update((m["name"], m) for m in json.loads(get(f"{base}/api/models")[2])
                                               ["models"]) or ", ".join(listed))
    for model in [None, *args.model]:
        def one(model=model):
            assert model is None or model in listed, f"{model} is not offered by the image: {sorted(listed)}"
            done = asyncio.run(asyncio.wait_for(generate(base, model), GENERATION_TIMEOUT_S))
            return (f"{done['model']['name']}: {done['num_output_tokens']} tokens, "
                    f"finish_reason {done['finish_reason']}, {done['text']!r}")
        check(f"/api/ws generation ({model or 'default model'})", one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
