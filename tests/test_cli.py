"""The command line: generate, check-distribution, models (run as real subprocesses)."""
import json
import os
import subprocess
import sys

import pytest

from fixtures_family import write_family


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return write_family(tmp_path_factory.mktemp("family"))


def cli(*args):
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": os.devnull}   # the stand-in family only: no fetched models
    r = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=120, env=env)
    return r.returncode, r.stdout, r.stderr


def test_generate_json_has_the_contract_fields(models_dir):
    code, out, err = cli("generate", "--prompt", "def f(x):", "--max-tokens", "30", "--json",
                         "--models-dir", str(models_dir), "--num-speculative-tokens", "3")
    assert code == 0, err
    s = json.loads(out)
    for key in ("text", "num_output_tokens", "tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                "acceptance_rate", "mean_acceptance_length", "accepted_per_position", "target_forward_calls",
                "draft_forward_calls", "elapsed_s", "ttft_s", "tpot_s", "kv_cache", "model", "settings"):
        assert key in s, key
    assert s["num_output_tokens"] == 30 and len(s["tokens"]) == 30
    assert {t["status"] for t in s["tokens"]} <= {"accepted", "resampled", "bonus", "target"}
    assert s["acceptance_rate"] == pytest.approx(s["num_accepted_tokens"] / s["num_draft_tokens"])
    assert s["mean_acceptance_length"] == pytest.approx(1 + s["num_accepted_tokens"] / s["num_drafts"])
    assert set(s["kv_cache"]) >= {"dtype", "num_kv_heads", "block_size", "bytes_per_token", "bytes_used",
                                  "blocks_allocated", "bytes_allocated"}
    assert len(s["accepted_per_position"]) <= 3


def test_generate_rejects_bad_settings_by_name(models_dir):
    code, _, err = cli("generate", "--prompt", "x", "--num-speculative-tokens", "40", "--models-dir", str(models_dir))
    assert code == 2 and "num_speculative_tokens" in err and "16" in err
    code, _, err = cli("generate", "--prompt", "x", "--kv-cache-dtype", "fp4", "--models-dir", str(models_dir))
    assert code == 2 and "kv_cache_dtype" in err


def test_check_distribution(models_dir):
    code, out, err = cli("check-distribution", "--prompt", "def ", "--samples", "20000", "--json",
                         "--models-dir", str(models_dir))
    assert code == 0, err
    r = json.loads(out)
    # 20,000 samples: speculative sampling is as close to p as direct sampling (x3 for noise), draft-only
    # sampling is not; acceptance matches sum(min(p, q)) within 0.02 (> 5 sigma).
    assert r["tvd_speculative"] <= 3 * r["tvd_direct"] + 0.01
    assert r["tvd_draft_only"] > r["tvd_speculative"]
    assert abs(r["acceptance_rate"] - r["theory_sum_min_p_q"]) <= 0.02


def test_check_distribution_takes_the_verification_rule(models_dir):
    code, out, err = cli("check-distribution", "--prompt", "def ", "--samples", "20000", "--json",
                         "--rejection-sample-method", "block", "--models-dir", str(models_dir))
    assert code == 0, err
    r = json.loads(out)
    assert r["rejection_sample_method"] == "block" and r["num_speculative_tokens"] == 2   # block's default γ
    assert r["tvd_speculative"] <= 3 * r["tvd_direct"] + 0.01                           # as the standard check
    assert r["standard_mean_acceptance_length"] is not None
    code, _, err = cli("check-distribution", "--prompt", "def ", "--rejection-sample-method", "blocks",
                       "--models-dir", str(models_dir))
    assert code == 2 and "rejection-sample-method" in err and "'block'" in err


def test_check_distribution_has_a_tree_mode():
    """--tree true on the shipped character model and its Medusa heads (trees of depth 3, top-4, 8 nodes), 5,000
    draws with seed 0: the first token's TVD is within 3x its expected value at the sampling noise, and a bad tree
    setting is an error naming it."""
    shipped = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
    code, out, err = cli("check-distribution", "--prompt", "import ", "--samples", "5000", "--json", "--tree", "true",
                         "--method", "medusa", "--models-dir", shipped)
    assert code == 0, err
    r = json.loads(out)
    assert r["tree"] and r["method"] == "medusa" and r["speculative_eagle_topk"] == 4 and r["mean_tree_nodes"] == 8
    assert r["tvd_speculative"] <= 3 * r["tvd_noise"]
    code, _, err = cli("check-distribution", "--prompt", "import ", "--tree", "true", "--speculative-eagle-topk", "9",
                       "--models-dir", shipped)
    assert code == 2 and "speculative_eagle_topk" in err and "8" in err


def test_generate_json_reports_the_verification_rule(models_dir):
    code, out, err = cli("generate", "--prompt", "def f(x):", "--max-tokens", "40", "--json", "--temperature", "1",
                         "--rejection-sample-method", "block", "--models-dir", str(models_dir))
    assert code == 0, err
    s = json.loads(out)
    assert s["settings"]["rejection_sample_method"] == "block"
    assert s["block_verification"]["num_drafts"] == s["num_drafts"] > 0
    code, _, err = cli("generate", "--prompt", "x", "--rejection-sample-method", "tree", "--models-dir", str(models_dir))
    assert code == 2 and "rejection_sample_method" in err and "'standard' or 'block'" in err


def test_models_lists_the_family(models_dir):
    code, out, err = cli("models", "--json", "--models-dir", str(models_dir))
    assert code == 0, err
    rows = json.loads(out)
    assert {r["name"] for r in rows} == {"target-mha", "target-gqa", "target-mqa", "draft"}
    assert {r["num_key_value_heads"] for r in rows if r["role"] == "target"} == {4, 2, 1}
