"""The Dockerfile, read: the shape the issues ask for, checked line by line. `make docker-check` builds and
starts it (podman, Debian stand-in bases); these checks also run where that cannot."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
sys.path.insert(0, str(ROOT / "scripts"))
from docker_bases import apt_mirror  # noqa: E402


def instructions(name: str, text: str = DOCKERFILE) -> list[str]:
    text = text.replace("\\\n", " ")
    return [line.split(None, 1)[1].strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#") and line.split(None, 1)[0].upper() == name]


def stages() -> dict[str, str]:
    """Each stage's text by its name (FROM ... AS name)."""
    parts = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", p).group(1): "FROM " + p for p in parts}


def test_base_images_are_build_arguments_defaulting_to_docker_hubs_slim_images():
    global_args = dict(a.split("=", 1) for a in instructions("ARG", DOCKERFILE.split("\nFROM ")[0]))
    assert global_args["NODE_IMAGE"] == "node:20-slim"
    assert re.fullmatch(r"python:3\.1[1-9]-slim", global_args["PYTHON_IMAGE"])
    froms = instructions("FROM")
    assert froms[0] == "${NODE_IMAGE} AS frontend" and froms[-1] == "${PYTHON_IMAGE} AS runtime"
    assert all(f.split()[0] in ("${NODE_IMAGE}", "${PYTHON_IMAGE}") for f in froms)


def test_multi_stage_npm_ci_and_a_lean_runtime_stage():
    runtime = stages()["runtime"]
    assert "npm ci" in stages()["frontend"]
    assert all("--from=frontend" in c for c in instructions("COPY", runtime) if "node_modules" in c)
    copied = [c.split()[0] for c in instructions("COPY", runtime) if not c.startswith("--from")]
    assert sorted(copied) == ["models", "static", "templates"]          # no tests, docs, scripts, sources
    assert "[test]" not in runtime and "PIP_NO_CACHE_DIR=1" in runtime


def test_smollm2_only_when_asked_for_and_present():
    smollm2 = stages()["smollm2"]
    assert "ARG SMOLLM2=\n" in smollm2 and "COPY docker-models /context" in smollm2     # default: none
    assert "fetched.json" in smollm2 and "exit 1" in smollm2            # asked for but absent: the build fails
    assert "COPY --from=smollm2 /cache cache" in stages()["runtime"]
    assert "DECODING_PLAYGROUND_CACHE=/app/cache" in stages()["runtime"]


def test_non_root_exec_form_cmd_healthcheck_through_python_on_all_interfaces():
    assert instructions("USER") == ["playground"]
    cmd = json.loads(instructions("CMD")[-1])                 # exec form: a JSON array
    assert cmd[:2] == ["decoding-playground", "serve"] and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    health = instructions("HEALTHCHECK")[0]
    probe = json.loads(health[health.index("CMD") + 3:].strip())
    assert probe[0] == "python" and "/healthz" in probe[-1] and "curl" not in health
    env = " ".join(instructions("ENV"))
    assert "OPENBLAS_NUM_THREADS=1" in env and "DECODING_PLAYGROUND_HOME=/app" in env
    assert "--allowed-origin" not in DOCKERFILE.split("CMD")[-1]     # the Origin check stays on, own origin only


def test_the_bases_come_from_the_mirror_apt_already_uses(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    assert apt_mirror(etc_apt=tmp_path) == "http://deb.debian.org/debian"          # nothing configured
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    assert apt_mirror(etc_apt=tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://line.example/debian bookworm main non-free\n")
    assert apt_mirror(etc_apt=tmp_path) == "http://line.example/debian"          # sources.list is read first


def test_the_lean_check_finds_test_packages_caches_and_node_modules(tmp_path):
    from docker_check import check_lean

    def image(*files: str) -> Path:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for rel in ("app/node_modules/htmx.org/dist/htmx.min.js", "app/node_modules/htmx-ext-ws/dist/ws.js",
                    "opt/venv/lib/python3.11/site-packages/numpy/__init__.py", *files):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("x")
        return root

    check_lean(image(), "/app")
    for extra in ("opt/venv/lib/python3.11/site-packages/pytest/__init__.py", "root/.cache/pip/http/x",
                  "app/node_modules/htmx.org/package.json", "app/tests/test_x.py"):
        with pytest.raises(SystemExit, match="not lean"):
            check_lean(image(extra), "/app")
