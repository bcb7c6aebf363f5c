"""The Dockerfile, read (Docker cannot run here): the shape the issue asks for, checked line by line."""
import json
import re
from pathlib import Path

DOCKERFILE = (Path(__file__).resolve().parent.parent / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    text = DOCKERFILE.replace("\\\n", " ")
    return [line.split(None, 1)[1].strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#") and line.split(None, 1)[0].upper() == name]


def test_multi_stage_node_npm_ci_then_slim_python():
    froms = instructions("FROM")
    assert len(froms) == 2 and froms[0].startswith("node:") and " AS frontend" in froms[0]
    assert re.match(r"python:3\.1[1-9]-slim", froms[1])
    assert any("npm ci" in r for r in instructions("RUN"))
    assert all("--from=frontend" in c for c in instructions("COPY") if "node_modules" in c)


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
