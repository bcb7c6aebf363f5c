"""`decoding-playground train-heads` end to end on the character target: data, train (resumed), eval, export."""
import json
import subprocess
import sys

from safetensors.numpy import load_file


def train_heads(*args):
    r = subprocess.run([sys.executable, "-m", "cli.main", "train-heads", "target-mha", *args], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_data_train_resume_eval_and_export_of_the_character_targets_heads(tmp_path):
    config = json.dumps({"steps": 4, "eval_every": 0, "vocab_subset": 64, "seq_len": 64, "batch_size": 2,
                         "ckpt_every": 2})
    train_heads("data", "--folder", str(tmp_path), "--prompts", "12")
    assert len((tmp_path / "data" / "conversations.jsonl").read_text().splitlines()) == 12
    no_held_out = subprocess.run([sys.executable, "-m", "cli.main", "train-heads", "target-mha", "eval", "--folder",
                                  str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert no_held_out.returncode != 0 and "data --held-out" in no_held_out.stderr
    train_heads("data", "--folder", str(tmp_path), "--prompts", "4", "--held-out")   # the corpus's validation files
    assert len((tmp_path / "heldout" / "conversations.jsonl").read_text().splitlines()) == 4
    train_heads("train", "--folder", str(tmp_path), "--config", config.replace('"steps": 4', '"steps": 2'))
    resumed = train_heads("train", "--folder", str(tmp_path), "--config", config)
    assert "resumed at step 2" in resumed.stderr
    for where, of in (((), "held out"), (("--on-training",), "the last training conversations")):
        out = json.loads(train_heads("eval", "--folder", str(tmp_path), "--gamma", "2", "--conversations", "3",
                                     *where).stdout)
        assert out["of"] == of and out["conversations"] == 3 and len(out["eagle"]["per_position"]) == 2
        assert 1 <= out["eagle"]["run_acceptance_length"]["2"] <= 3
    train_heads("export", "--folder", str(tmp_path), "--out", str(tmp_path / "heads"), "--vocab-subset", "32")
    eagle = load_file(str(tmp_path / "heads" / "eagle.safetensors"))
    assert len(eagle["vocab_subset"]) == 32 and eagle["fc.weight"].dtype.name == "float16"
    assert json.loads((tmp_path / "heads" / "training.json").read_text())["steps"] == 4
