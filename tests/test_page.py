"""The page's HTML and the JSON API, in memory: URL state, hidden parts, themes, embedding, models, stats."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from app.config import AppConfig, normalize_origin
from app.main import create_app


class Form(HTMLParser):
    """Field values of the page's form, as a browser would submit them; and every element's attributes."""

    def __init__(self, html: str):
        super().__init__()
        self.values: dict[str, str] = {}
        self.elements: list[tuple[str, dict]] = []
        self._select: str | None = None
        self._textarea: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        name = a.get("name")
        if tag == "input" and name:
            if a.get("type") == "checkbox":
                if "checked" in a:
                    self.values[name] = a.get("value", "on")
            elif a.get("type") == "hidden":
                self.values.setdefault(name, a.get("value", ""))
            else:
                self.values[name] = a.get("value", "")
        elif tag == "select":
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.values[self._select] = a.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.values[self._textarea] += data

    def by_id(self, id_: str) -> dict | None:
        return next((a for _, a in self.elements if a.get("id") == id_), None)


@pytest.fixture(scope="module")
def app_client(models_dir):
    config = AppConfig(models_dir=models_dir, embed_frame_ancestors="https://slides.example", demo="character")
    with TestClient(create_app(config), base_url="http://localhost") as c:
        yield c


def test_every_setting_is_a_form_field_named_as_the_contract(app_client):
    form = Form(app_client.get("/").text)
    for name in ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "method", "num_speculative_tokens",
                 "prompt_lookup_min", "prompt_lookup_max", "kv_cache", "kv_cache_dtype", "num_kv_heads", "block_size",
                 "enable_prefix_caching", "speed"]:
        assert name in form.values, name
    assert form.values["method"] == "draft_model" and form.values["num_speculative_tokens"] == "4"
    assert form.values["kv_cache"] == "true" and form.values["block_size"] == "16"


def test_url_settings_are_rendered_into_the_form(app_client):
    url = ("/?method=ngram&num_speculative_tokens=7&temperature=0.5&seed=42&kv_cache_dtype=int8&block_size=32"
           "&kv_cache=false&enable_prefix_caching=false&num_kv_heads=1&max_tokens=77&top_p=0.9"
           "&prompt=for%20i%20in%20x%3A%0A&speed=max&theme=dark")
    html = app_client.get(url).text
    form = Form(html)
    assert form.values["method"] == "ngram"
    assert form.values["num_speculative_tokens"] == "7"
    assert form.values["temperature"] == "0.5" and form.values["top_p"] == "0.9"
    assert form.values["seed"] == "42" and form.values["max_tokens"] == "77"
    assert form.values["kv_cache_dtype"] == "int8_per_token_head"      # alias resolved
    assert form.values["block_size"] == "32" and form.values["num_kv_heads"] == "1"
    assert form.values["kv_cache"] == "false" and form.values["enable_prefix_caching"] == "false"
    assert form.values["prompt"] == "for i in x:\n"
    assert form.values["speed"] == "max"
    assert 'data-theme="dark"' in html
    assert "warning-banner" not in html


def test_the_verification_rule_is_a_select_the_url_sets(app_client):
    assert Form(app_client.get("/").text).values["rejection_sample_method"] == "standard"
    html = app_client.get("/?rejection_sample_method=block").text
    assert Form(html).values["rejection_sample_method"] == "block" and "warning-banner" not in html
    assert '<option value="standard">standard</option><option value="block" selected>block</option>' in html
    bad = app_client.get("/?rejection_sample_method=tree").text
    assert "warning-banner" in bad and "rejection_sample_method" in bad


@pytest.mark.parametrize("query, needle", [
    ("num_speculative_tokens=99", "num_speculative_tokens"),
    ("temperature=hot", "temperature"),
    ("block_size=12", "block_size"),
    ("num_kv_heads=5", "num_kv_heads"),
    ("model=nope", "model"),
    ("speed=warp", "speed"),
    ("theme=sepia", "theme"),
    ("hide=everything", "hide"),
    ("layout=poster", "layout"),
    ("race=top_p", "race"),
    ("race=num_kv_heads&race_a=6&race_b=5", "race_b"),
    ("prompt_lookup_min=5&prompt_lookup_max=2", "prompt_lookup"),
])
def test_a_bad_url_value_is_ignored_with_a_visible_warning(app_client, query, needle):
    response = app_client.get("/?" + query)
    assert response.status_code == 200
    assert "warning-banner" in response.text and needle in response.text
    assert Form(response.text).values["num_speculative_tokens"] == "4"


def test_hide_presenter_and_autoplay(app_client):
    html = app_client.get("/?hide=settings,notes,header&presenter=1&autoplay=1").text
    form = Form(html)
    hidden = {a.get("data-part") for _, a in form.elements if "data-part" in a and "hidden" in a}
    assert hidden == {"settings", "notes", "header"}
    assert form.by_id("playground")["data-autoplay"] == "1"
    body = next(a for t, a in form.elements if t == "body")
    assert "presenter" in body["class"].split()
    # hidden parts stay in the page: the websocket's fragments still find their targets
    for target in ["notes", "stream", "run-status", "draft-lane", "kv-target-grid", "m-kv_bytes_per_token"]:
        assert form.by_id(target) is not None, target


def test_hide_can_take_a_whole_column_away(app_client):
    form = Form(app_client.get("/embed?hide=sidebar,gauges,chart,legend,notes,status").text)
    assert form.by_id("controls")["data-part"] == "sidebar" and "hidden" in form.by_id("controls")
    assert set(form.by_id("playground")["class"].split()) == {"playground", "no-sidebar", "no-side-col"}
    run_head = next(a for _, a in form.elements if a.get("data-part") == "status")
    assert "hidden" in run_head
    # the settings column's parts one by one collapse it too (a watcher's page)
    assert "no-sidebar" in Form(app_client.get("/?hide=prompt,controls,settings").text).by_id("playground")["class"]
    assert "no-sidebar" not in Form(app_client.get("/?hide=prompt,controls").text).by_id("playground")["class"]


def test_layouts_and_races_come_from_the_url(app_client):
    form = Form(app_client.get("/embed?layout=view:race&race=num_kv_heads&race_a=6&race_b=1").text)
    body = next(a for t, a in form.elements if t == "body")
    assert body["data-layout"] == "view:race"
    assert "hidden" not in form.by_id("view-race") and form.by_id("teach")["data-open"] == "race"
    assert form.values["race"] == "num_kv_heads" and (form.values["race_a"], form.values["race_b"]) == ("6", "1")
    assert form.by_id("f-layout") is not None
    form = Form(app_client.get("/?layout=kv&model=target-mha").text)
    assert next(a for t, a in form.elements if t == "body")["data-layout"] == "kv"
    assert form.values["race"] == "method" and (form.values["race_a"], form.values["race_b"]) == ("none", "draft_model")
    assert "data-layout" not in next(a for t, a in Form(app_client.get("/").text).elements if t == "body")
    # a race offers what the page's model can run: the heads are trained for target-mha only
    for model, heads in (("target-mha", True), ("target-gqa", False)):
        offered = {a["value"] for t, a in Form(app_client.get(f"/?model={model}").text).elements
                   if t == "option" and a.get("data-setting") == "method"}
        assert offered >= {"none", "draft_model", "ngram"} and ({"eagle", "medusa"} <= offered) == heads, model


def test_page_fragment_targets_exist_in_both_views(app_client):
    for path in ("/", "/embed"):
        form = Form(app_client.get(path).text)
        for target in ["stream", "draft-lane", "run-status", "error", "summary", "conn", "model-info", "notes",
                       "chart-feed", "kv-target-grid", "kv-target-caption", "kv-draft-grid", "kv-draft-caption",
                       "mh-kv_cache_bytes"]:
            assert form.by_id(target) is not None, (path, target)
        metrics = {a["data-metric"] for _, a in form.elements if "data-metric" in a}
        assert len(metrics) == 8


def test_embed_framing_is_configurable_and_the_page_is_not_embeddable_elsewhere(app_client):
    embed = app_client.get("/embed")
    assert "frame-ancestors https://slides.example" in embed.headers["content-security-policy"]
    assert "x-frame-options" not in embed.headers
    assert "site-header" not in embed.text
    assert "frame-ancestors 'self'" in app_client.get("/").headers["content-security-policy"]


def test_api_models_lists_targets_with_their_kv_head_variants(app_client):
    body = app_client.get("/api/models").json()
    models = {m["name"]: m for m in body["models"]}
    targets = [m for m in models.values() if m["role"] == "target"]
    assert targets and any(m["role"] == "draft" for m in models.values())
    for t in targets:
        assert t["num_key_value_heads"] in t["kv_head_variants"]
    assert {m["attention"] for m in targets} >= {"MHA", "MQA"}


def test_api_stats_reports_sessions_and_blocks(app_client):
    stats = app_client.get("/api/stats").json()
    assert {"sessions", "kv_blocks_used", "kv_blocks_total"} <= stats.keys()
    assert stats["sessions"] == 0 and stats["kv_blocks_used"] == 0


def test_missing_models_leave_the_page_up_with_the_reason(tmp_path):
    with TestClient(create_app(AppConfig(models_dir=tmp_path)), base_url="http://localhost") as client:
        page = client.get("/")
        assert page.status_code == 200 and "no models loaded" in page.text
        assert client.get("/api/models").json()["models"] == []
        with client.websocket_connect("ws://localhost/api/ws") as ws:
            ws.send_json({"type": "start", "prompt": "x"})
            error = ws.receive_json()
            assert error["type"] == "error" and "no models" in error["message"]


@pytest.mark.parametrize("raw, origin", [
    ("http://Example.org:80/", "http://example.org"),
    ("https://example.org:443", "https://example.org"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
])
def test_origins_are_normalized_for_exact_comparison(raw, origin):
    assert normalize_origin(raw) == origin


@pytest.mark.parametrize("raw", ["null", "example.org", "http://example.org/path", "http://"])
def test_not_an_origin(raw):
    with pytest.raises(ValueError):
        normalize_origin(raw)


def test_config_from_environment(tmp_path):
    config = AppConfig.from_env({"DECODING_PLAYGROUND_MODELS_DIR": str(tmp_path),
                                 "DECODING_PLAYGROUND_ALLOWED_ORIGINS": "https://a.example, http://b.example:8080",
                                 "DECODING_PLAYGROUND_MAX_SESSIONS": "3",
                                 "DECODING_PLAYGROUND_FRAME_ANCESTORS": "'self' https://a.example"})
    assert config.models_dir == tmp_path and config.max_sessions == 3
    assert config.allowed_origins == ("https://a.example", "http://b.example:8080")
    assert config.embed_frame_ancestors == "'self' https://a.example"
    with pytest.raises(ValueError):
        AppConfig(embed_frame_ancestors="*; script-src *")


def test_serve_options_override_the_environment(tmp_path, monkeypatch):
    from cli.main import build_parser

    monkeypatch.setenv("DECODING_PLAYGROUND_MAX_SESSIONS", "5")
    args = build_parser().parse_args(["serve", "--models-dir", str(tmp_path), "--allowed-origin", "https://a.example",
                                      "--allowed-origin", "https://b.example", "--frame-ancestors", "'self'"])
    config = AppConfig.from_env().with_overrides(
        models_dir=args.models_dir, allowed_origins=tuple(args.allowed_origin), max_sessions=args.max_sessions,
        embed_frame_ancestors=args.frame_ancestors)
    assert config.models_dir == tmp_path and config.max_sessions == 5
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.embed_frame_ancestors == "'self'"
    assert build_parser().parse_args(["bench", "page", "--quick"]).measure.__module__ == "cli.bench.page"


def test_streamed_tokens_are_escaped_and_whitespace_made_visible():
    from types import SimpleNamespace

    from app.views.fragments import piece, token_html

    t = SimpleNamespace(status="accepted", round=3, position=2, text='<img src=x onerror="a">', p=0.5, q=0.25,
                        accept_prob=1.0, r=None)
    html = token_html(t)
    assert "<img" not in html and "&lt;img src=x onerror=&#34;a&#34;&gt;" in html
    assert 'data-token-status="accepted"' in html and 'data-round="3"' in html and 'data-pos="2"' in html
    assert 'title="accepted · p=0.500 · q=0.250 · min(1, p/q)=1.000"' in html
    assert piece("\n").endswith("\n") and "↵" in piece("\n")
    assert "end of text" in piece("<|endoftext|>")


def test_a_chat_template_collapses_and_the_prompt_last_line_runs_into_the_answer():
    from app.views.templating import macros

    tokens = [{"id": 1, "text": "<|im_start|>", "template": True}, {"id": 2, "text": "user", "template": True},
              {"id": 3, "text": "\n", "template": True}, {"id": 4, "text": "Hi"}, {"id": 5, "text": " <b>"},
              {"id": 6, "text": "<|im_end|>", "template": True}, {"id": 7, "text": "\n", "template": True}]
    html = str(macros().stream(tokens, 1))
    head = html.split('class="prompt prompt-head"')[1]
    assert "prompt-tail" not in html                      # the template's last line break ends the prompt
    assert head.count('class="tpl-toggle"') == 2 and "chat template: user · 3 tokens" in head
    assert "chat template: end of turn · 2 tokens" in head and "Hi &lt;b&gt;" in head
    html = str(macros().stream([{"id": 1, "text": "def f():"}, {"id": 2, "text": "\n"}, {"id": 3, "text": "    "}], 2))
    assert 'prompt-head' in html and '<span class="prompt prompt-tail" title="the prompt">    </span>' in html
    assert "tpl-toggle" not in html


def test_a_chat_template_knows_where_the_user_text_sits():
    from engine.model.chat import ChatTemplate

    chat = ChatTemplate("chatml", "You are an assistant")
    for user in ("assistant", "", "<|im_end|>user"):
        text = chat.prompt(user)
        start, end = chat.user_span(user)
        assert text[start:end] == user and text[:start].endswith("<|im_start|>user\n")


def test_a_draft_lane_chip_of_spaces_is_not_blank():
    """A chip stands alone: a token of spaces must show them (␣), and its text stays escaped."""
    from app.views.templating import macros

    d = {"status": "accepted", "q": 1.0, "accept_prob": 1.0, "r": None}
    html = str(macros().lane({"round": 4, "method": "draft_model", "verdict": "",
                              "drafts": [{**d, "text": "  "}, {**d, "text": " <b>"}],
                              "final": {"status": "bonus", "position": 3, "p": 0.9, "text": "\n"}}))
    chips = html.split('class="chip')[1:]
    assert chips[0].count("␣") == 2
    assert chips[1].count("␣") == 1 and "&lt;b&gt;" in chips[1] and "<b>" not in chips[1]
    assert "↵" in chips[2]


def test_serve_command_serves_the_given_models_and_origins(models_dir):
    """`decoding-playground serve` end to end: its options reach the app."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from websockets.sync.client import connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--models-dir",
                             str(models_dir), "--allowed-origin", "https://slides.example", "--max-sessions", "3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/api/stats", timeout=1) as r:
                    stats = json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "serve did not answer within 60 s"
                time.sleep(0.1)
        assert stats["max_sessions"] == 3
        with urllib.request.urlopen(base + "/api/models", timeout=5) as r:
            assert json.loads(r.read())["models"]
        with connect(f"ws://127.0.0.1:{port}/api/ws", origin="https://slides.example", open_timeout=10) as ws:
            ws.send(json.dumps({"type": "pause"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "error"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_tree_the_engine_leaves_out_is_shown_as_a_chain(tmp_path):
    """Where `bench heads` measured a tree fastest (demo.json, here written for the shipped character model), the page
    opens on it; a link naming a method that drafts no tree, or its own γ, shows the chain that runs instead (a form
    still carrying the tree would start an error: a tree on the draft model)."""
    import json
    import shutil

    from engine.spec_decode.heads import HEADS_DIR

    shutil.copytree(HEADS_DIR / "target-mha", tmp_path / "target-mha")
    (tmp_path / "target-mha" / "demo.json").write_text(json.dumps({"by_threads": {"1": {
        "num_speculative_tokens": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 3}}}))
    with TestClient(create_app(AppConfig(demo="character")), base_url="http://localhost") as c:
        c.app.state.playground.registry.heads_dir = tmp_path
        tree = Form(c.get("/").text).values
        assert (tree["method"], tree["speculative_eagle_topk"], tree["speculative_num_draft_tokens"]) == ("eagle", "2", "3")
        for query in ("/?method=draft_model", "/?method=eagle&num_speculative_tokens=4"):
            chain = Form(c.get(query).text).values
            assert (chain["speculative_eagle_topk"], chain["speculative_num_draft_tokens"]) == ("1", ""), query
