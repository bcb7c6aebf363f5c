"""`bench serve --sweep --workload ...` end to end: real clients asking a workload's prompts of a real server, every
cell of γ x concurrency measured, and the `batch` schedule's table made from them (not stored with --no-write)."""
import json
import os
import subprocess
import sys

import pytest

from engine.spec_decode.batch_schedule import TABLES_DIR, validated_table


@pytest.mark.parametrize("workload, method", [("workshop", "suffix"), ("agentic", "ngram")])
def test_a_sweep_of_a_workload_measures_every_cell_and_makes_a_table(models_dir, workload, method):
    stored = {f.name: f.read_text() for f in TABLES_DIR.glob("*.json")}
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": os.devnull, "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "cli.main", "bench", "serve", "--sweep", "--workload", workload,
                        "--method", method, "--repeats", "1", "--max-tokens", "6", "--models-dir", str(models_dir),
                        "--json", "--no-write"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["workload"], out["method"], out["model"]) == (workload, method, "target-mha")
    assert {(x["gamma"], x["concurrency"]) for x in out["rows"]} == {
        (g, c) for g in ("none", 2, 4, 6, "acceptance", "batch") for c in (1, 4, 16)}
    assert all(x["errors"] == 0 and x["tokens_per_s"] > 0 for x in out["rows"])
    table = validated_table(out["table"])
    assert [e[:2] for e in table] == [(1, 3), (4, 15), (16, 16)] and all(e[2] in (0, 2, 4, 6) for e in table)
    assert out["kv_blocks_used_after"] == 0
    assert {f.name: f.read_text() for f in TABLES_DIR.glob("*.json")} == stored     # --no-write: nothing stored
