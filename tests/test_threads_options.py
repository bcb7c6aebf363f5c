"""`--threads` of serve and generate, and DECODING_PLAYGROUND_THREADS: bounded, passed on, logged."""
import json
import os
import subprocess
import sys

import pytest

from app.config import AppConfig
from cli.main import build_parser


def test_serve_and_generate_take_a_thread_count():
    p = build_parser()
    assert p.parse_args(["serve", "--threads", "2"]).threads == 2
    assert p.parse_args(["serve"]).threads is None
    assert p.parse_args(["generate", "--prompt", "x", "-t", "3"]).threads == 3
    for bad in ("0", "257", "two"):
        with pytest.raises(SystemExit):
            p.parse_args(["serve", "--threads", bad])


def test_the_environment_sets_it_and_the_config_bounds_it():
    assert AppConfig.from_env({"DECODING_PLAYGROUND_THREADS": "2"}).threads == 2
    assert AppConfig.from_env({}).threads is None
    with pytest.raises(ValueError, match="threads"):
        AppConfig(threads=0)


def test_generate_on_a_small_model_reports_no_weight_threads():
    """Our character models stay on one thread: nothing is measured or chosen for them."""
    done = subprocess.run([sys.executable, "-m", "cli.main", "generate", "--prompt", "def f(", "--json",
                           "--max-tokens", "4", "--threads", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["threads"] is None
