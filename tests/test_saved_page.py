"""A run saved as one page (issue 32): `GET /teach/recordings/{key}.html` and `decoding-playground export-page` write a
single HTML file that holds the run's frames (the page's own messages) and loads nothing else. Real server, real
recordings; the browser test (tests/e2e/test_stage.py) plays such a file from disk with the network off."""
from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import websockets

from app.views.recording import RECORDINGS, Recording
from app.views.replay import replay_frames
from ws_client import run, ws_url
from test_ws_html import HtmlClient, status_is

FRAMES = re.compile(r'<script type="application/json" id="run-frames" data-encoding="([^"]+)">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def recorded(live_server) -> str:
    """The key of a finished run (draft model, sampled: every status)."""
    async def scenario():
        async with websockets.connect(ws_url(live_server, "/ws"), open_timeout=10, max_size=2 ** 24) as ws:
            c = HtmlClient(ws)
            await c.until(lambda f: True)
            await c.send(action="toggle", max_tokens="60", speed="max", temperature="0.8", seed="5",
                         prompt="def parse(line):\n    ")
            await c.until(status_is("done"))
            return next(a["data-recording"] for _, a in c.elements(lambda t, a: a.get("id") == "stream")
                        if a.get("data-recording"))
    return run(scenario())


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def frames_of(html: str) -> list[str]:
    encoding, text = FRAMES.search(html).groups()
    if encoding == "gzip+base64":
        return json.loads(gzip.decompress(base64.b64decode(text)))
    assert encoding == "json" and "<" not in text               # nothing in it can end the script element
    return json.loads(text)


def test_the_saved_page_is_one_self_contained_file_of_the_runs_own_frames(live_server, recorded):
    status, headers, body = get(f"{live_server}/teach/recordings/{recorded}.html?layout=stream&presenter=1&theme=dark"
                                "&hide=notes,views&speed=max")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert re.fullmatch(r'attachment; filename="decoding-playground-\d{8}-\d{6}-[0-9a-f]{8}\.html"',
                        headers["content-disposition"])
    html = body.decode()
    assert not re.search(r'\b(?:src|href|action|srcset|poster)="(?!#)[^"]', html)      # no URL to load anything from
    assert "url(" not in html and "@import" not in html and "<link" not in html
    assert "default-src 'none'" in html                          # and a CSP that would refuse it anyway
    assert '<body class="embed standalone presenter" data-layout="stream">' in html
    assert 'data-theme="dark"' in html and re.search(r'class="panel notes-panel" data-part="notes" hidden', html)
    assert '<option value="max" selected>' in html
    assert frames_of(html) == replay_frames(RECORDINGS.get(recorded))   # the page's messages (this process's server)
    assert get(f"{live_server}/teach/recordings/{recorded}.html?layout=stream&presenter=1&theme=dark&hide=notes,views"
               "&speed=max")[2] == body                                                 # the same run, the same bytes


@pytest.mark.parametrize("query, needle", [("layout=view:theory", "layout"), ("theme=pink", "theme"),
                                           ("speed=7", "speed")])
def test_a_bad_option_is_a_400_naming_it(live_server, recorded, query, needle):
    status, _, body = get(f"{live_server}/teach/recordings/{recorded}.html?{query}")
    assert status == 400 and json.loads(body)["error"].startswith(needle)


def test_a_run_no_longer_kept_is_a_404(live_server):
    assert get(f"{live_server}/teach/recordings/{'0' * 32}.html")[0] == 404


def test_export_page_turns_a_recording_file_into_the_page(live_server, recorded, tmp_path):
    source = tmp_path / "talk.json"
    source.write_bytes(get(f"{live_server}/teach/recordings/{recorded}.json")[2])
    r = subprocess.run([sys.executable, "-m", "cli.main", "export-page", str(source), "--layout", "gauges", "--theme",
                        "dark", "--autoplay"], capture_output=True, text=True, timeout=120)
    page = tmp_path / "talk.html"
    assert r.returncode == 0 and str(page) in r.stderr, r.stderr
    html = page.read_text()
    assert 'data-layout="gauges"' in html and 'data-autoplay="1"' in html and 'data-theme="dark"' in html
    assert frames_of(html) == replay_frames(Recording.from_json(json.loads(source.read_text()), name="talk.json"))
    r = subprocess.run([sys.executable, "-m", "cli.main", "export-page", str(source), "-o", "-", "--plain"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(frames_of(r.stdout)) == len(frames_of(html))


@pytest.mark.parametrize("content, needle", [("{}", "not a recording"), ("[1", "not a recording"),
                                             ('{"format": "decoding-playground/recording", "version": 1, "events": [1',
                                              "event 0: an object with a type, not a number"),
                                             ('{"format": "decoding-playground/recording", "version": 1, "events": [{',
                                              "event 0: Expecting property name"),
                                             ('{"format": "decoding-playground/recording", "version": 9}', "version")])
def test_export_page_refuses_what_is_not_a_recording_in_one_line(tmp_path, content, needle):
    source = tmp_path / "bad.json"
    source.write_text(content)
    r = subprocess.run([sys.executable, "-m", "cli.main", "export-page", str(source)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad.html").exists()
