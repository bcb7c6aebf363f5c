"""The models a process serves, and the KV cache pools they share.

`ModelRegistry` loads the shipped family from models/index.json (or takes models built in memory), and
lists the pretrained models `fetch-model` converted into the cache (engine/model/fetched.py; loaded on first use).
`InferenceEngine` adds one KV cache manager per (model, cache dtype, block size), created on first
use, so that sessions of the same model share blocks and the prefix cache; together they stay within a memory
budget, idle pools freed to make room (engine/serving/pools.py).

NOTE: heads (`MadeOnce`) and pools (`KVPools`) are made once per key whichever threads ask at the same moment: a
server's warm-up and the worker threads of concurrent starts all ask for a target's pool once its weights are in
memory; had each made its own (all but one thrown away after), a pool's memory (hundreds of MiB for SmolLM2)
would have been taken once per asker at the same moment.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from ..kv.cache import KVCacheManager
from ..kv.dtypes import kv_bytes_per_token
from ..model.config import ModelConfig
from ..model.checkpoint import load_checkpoint
from ..model.fetched import LazyModel, fetched_models
from ..model.llama import Model
from ..model.loaded_model import LoadedModel
from ..model.shipped_drafts import shipped_drafts
from ..spec_decode.heads import HEADS_DIR, available_heads, load_heads
from ..spec_decode.suffix_caches import DEFAULT_MAX_TREE_NODES, SuffixCaches
from .pools import KVPools, PoolBudgetError
from .settings import GenerationSettings, excerpt

logger = logging.getLogger(__name__)
MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
SEQUENCE_TOKENS_BUDGET = 2048
# The KV memory budget when none is given: twice the pools made at start-up, so that beside them in use one more
# pool of the largest model (another cache dtype or block size, sized alike) still fits.
DEFAULT_POOL_MEMORY_FACTOR = 2
WARM_SETTINGS = (GenerationSettings(), GenerationSettings(method="eagle"))


class MadeOnce:
    """Values made once per key, from any thread: the first asker makes one (holding only that key's lock),
    those asking for the same key meanwhile wait for it, and askers of other keys are not held up. A make that
    raises leaves nothing behind: the next asker tries again and gets its own error.
    `made` (key -> value) is only ever added to; copy it (`list(made.values())`) to read it from another thread."""

    def __init__(self):
        self.made: dict = {}
        self._making: dict = {}                   # key -> the lock its maker holds
        self._lock = threading.Lock()

    def get(self, key, make: Callable[[], object]):
        if key in self.made:
            return self.made[key]
        with self._lock:
            key_lock = self._making.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self.made:
                self.made[key] = make()
            return self.made[key]


class ModelRegistry:
    def __init__(self, models: list[LoadedModel]):
        if not any(m.role == "target" for m in models):
            raise ValueError("no target model")
        self.models = {m.name: m for m in models}
        self.heads_dir = HEADS_DIR
        self._heads = MadeOnce()                  # target name -> its heads
        for m in models:
            m.meta.setdefault("heads", available_heads(m.name, self.heads_dir))

    @classmethod
    def from_dir(cls, models_dir: str | Path = MODELS_DIR, fetched: bool | str | Path = True) -> "ModelRegistry":
        """Our models from models_dir/index.json, and next to them the fetched ones (True: from the default
        cache, a path: from that cache, False: none) with the draft models shipped for them (models_dir/drafts)."""
        models_dir = Path(models_dir)
        index = models_dir / "index.json"
        if not index.is_file():
            raise FileNotFoundError(f"{index}: no model index; train the models (decoding-playground train)")
        extra = [] if fetched is False else fetched_models(None if fetched is True else fetched)
        extra += shipped_drafts(extra, models_dir / "drafts")
        entries = json.loads(index.read_text())
        entries = entries.get("models", entries) if isinstance(entries, dict) else entries
        loaded = []
        for e in entries:
            path = models_dir / Path(e["path"]).name
            cfg, weights, tok = load_checkpoint(path)
            meta = {k: v for k, v in e.items() if k not in ("name", "path", "role")}
            loaded.append(LoadedModel(e["name"], e["role"], cfg, Model(cfg, weights), tok, str(path), meta))
        return cls(loaded + extra)

    @property
    def targets(self) -> list[LoadedModel]:
        return [m for m in self.models.values() if m.role == "target"]

    @property
    def drafts(self) -> list[LoadedModel]:
        return [m for m in self.models.values() if m.role == "draft"]

    def default_target(self) -> LoadedModel:
        mha = [m for m in self.targets if m.cfg.attention_kind == "MHA"]
        return (mha or self.targets)[0]

    def get(self, name: str | None) -> LoadedModel:
        """The model to run (a fetched model's weights are loaded here, on first use)."""
        if name is not None and name not in self.models:
            raise KeyError(f"unknown model {excerpt(name)}; available: {', '.join(self.models)}")
        lm = self.default_target() if name is None else self.models[name]
        if isinstance(lm.model, LazyModel):
            lm.model = lm.model.load()
        return lm

    def variants(self, target: LoadedModel) -> dict[int, LoadedModel]:
        """Targets that differ from `target` only in num_key_value_heads (its MHA/GQA/MQA variants)."""
        base = target.cfg.replace(num_key_value_heads=1)
        return {m.cfg.num_key_value_heads: m for m in self.targets
                if m.cfg.replace(num_key_value_heads=1) == base and m.tokenizer is not None}

    def set_heads(self, target_name: str, heads: dict) -> None:
        """Heads built in memory (tests, evaluation) instead of models/heads/."""
        self._heads.made[target_name] = heads
        self.models[target_name].meta["heads"] = sorted(heads)

    def heads_for(self, target: LoadedModel) -> dict:
        """The draft heads trained for this target ({'eagle': ..., 'medusa': ...}; loaded on first use, once)."""
        def load() -> dict:
            if not available_heads(target.name, self.heads_dir):
                return {}
            model = self.get(target.name).model
            return load_heads(target.name, target.cfg, model.embed, target.path, self.heads_dir, model.layout)
        return self._heads.get(target.name, load)

    def draft_for(self, target: LoadedModel) -> LoadedModel | None:
        """The draft model that drafts for `target`: one shipped for it (engine/model/shipped_drafts.py), else one of
        our family that shares its vocabulary. Loads nothing: `get(draft.name)` loads a shipped draft's weights."""
        for d in self.drafts:
            if d.meta.get("draft_for", target.name) == target.name and d.cfg.vocab_size == target.cfg.vocab_size:
                return d
        return None


@dataclass(frozen=True)
class PoolSpec:
    """A KV pool before it is made: which, and what it will hold (every slot written at once: engine/kv/cache.py)."""
    role: str                      # target | draft | eagle
    name: str                      # the model's
    cfg: ModelConfig
    kv_cache_dtype: str
    block_size: int
    num_blocks: int

    @property
    def key(self) -> tuple:
        return (self.name, self.kv_cache_dtype, self.block_size)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_size * kv_bytes_per_token(self.cfg, self.kv_cache_dtype)

    def make(self) -> KVCacheManager:
        return KVCacheManager(self.cfg, self.num_blocks, self.block_size, self.kv_cache_dtype,
                              name=f"{self.role}:{self.name}")


class RunningSessions:
    """The model each session generates on, from `started` to its close: the batch size that the `batch` γ
    schedule looks up (engine/spec_decode/batch_schedule.py)."""

    def __init__(self):
        self._model_of: dict[str, str] = {}       # session id -> model name

    def join(self, model: str, session_id: str) -> None:
        self._model_of[session_id] = model

    def leave(self, session_id: str) -> None:
        self._model_of.pop(session_id, None)

    def batch_size(self, model: str, session_id: str) -> int:
        """The sessions on `model`, the asking one counted whether or not it has started."""
        return 1 + sum(m == model for s, m in list(self._model_of.items()) if s != session_id)


class InferenceEngine:
    """Models plus their shared KV pools, within `kv_cache_memory` bytes (engine/serving/pools.py; None: twice
    what the pools of every target's defaults take, `default_pool_bytes`), and suffix decoding's global trees
    (`suffix_caches`: shared by every session, or kept per session; engine/spec_decode/suffix_caches.py).
    NOTE: one lock serialises engine work (one engine thread)."""

    def __init__(self, registry: ModelRegistry, blocks_per_pool: int | None = None, max_sessions: int = 8,
                 kv_cache_memory: int | None = None, suffix_cache: str = "shared",
                 suffix_max_tree_nodes: int = DEFAULT_MAX_TREE_NODES):
        self.registry = registry
        self.blocks_per_pool = blocks_per_pool
        self.max_sessions = max_sessions
        self.default_pool_bytes = sum(spec.nbytes for spec in self.default_pool_specs().values())
        self.pools = KVPools(DEFAULT_POOL_MEMORY_FACTOR * self.default_pool_bytes if kv_cache_memory is None
                             else kv_cache_memory)
        self.managers: dict[tuple, KVCacheManager] = self.pools.made    # (model, dtype, block size) -> pool
        self.lock = threading.RLock()
        self.suffix_caches = SuffixCaches(suffix_cache, suffix_max_tree_nodes)
        self.running = RunningSessions()

    @property
    def kv_cache_memory(self) -> int:
        return self.pools.budget

    def pool_spec(self, lm, kv_cache_dtype: str, block_size: int) -> PoolSpec:
        """`lm`: a LoadedModel or a draft head (role, name, cfg)."""
        # sized for SEQUENCE_TOKENS_BUDGET tokens per session (a long-context model's full context for
        # every session would be thousands of blocks); a longer sequence gets a clear "exhausted" error
        ctx_blocks = -(-min(lm.cfg.max_position_embeddings, SEQUENCE_TOKENS_BUDGET) // block_size)
        # each session holds at most one context of its own plus a round of lookahead
        num_blocks = self.blocks_per_pool or self.max_sessions * (ctx_blocks + 2)
        return PoolSpec(lm.role, lm.name, lm.cfg, kv_cache_dtype, block_size, num_blocks)

    def pool_specs(self, target: LoadedModel, s: GenerationSettings) -> dict[tuple, PoolSpec]:
        """The pools a generation on `target` with settings `s` uses, by key. Loads nothing: an EAGLE head's pool
        is known from the target's shape (one layer of it; its K/V do not depend on the head's vocabulary)."""
        if not s.kv_cache:
            return {}
        if s.num_kv_heads is not None:
            target = self.registry.variants(target)[s.num_kv_heads]
        specs = [self.pool_spec(target, s.kv_cache_dtype, s.block_size)]
        draft = self.registry.draft_for(target) if s.method == "draft_model" else None
        if draft is not None:
            specs.append(self.pool_spec(draft, s.kv_cache_dtype, s.block_size))
        if s.method == "eagle" and "eagle" in target.meta.get("heads", ()):   # else the session refuses the method
            head = SimpleNamespace(role="eagle", name=f"{target.name}-eagle",
                                   cfg=target.cfg.replace(num_hidden_layers=1))
            specs.append(self.pool_spec(head, "auto", 16))
        return {spec.key: spec for spec in specs}

    def default_pool_specs(self) -> dict[tuple, PoolSpec]:
        """The pools a server makes at start-up (`warm_up`): every target's defaults and its EAGLE drafting."""
        return {k: spec for target in self.registry.targets for s in WARM_SETTINGS
                for k, spec in self.pool_specs(target, s).items()}

    def manager(self, lm, kv_cache_dtype: str, block_size: int, warm: bool = False) -> KVCacheManager:
        """The pool of (model, cache dtype, block size), made on first use; if another thread is making it, the
        one it makes. A pool no generation has claimed is reserved here (PoolBudgetError if it cannot fit)."""
        spec = self.pool_spec(lm, kv_cache_dtype, block_size)
        return self.pools.get(spec.key, spec.nbytes, spec.make, warm)

    def prepare_pools_for(self, target: LoadedModel, s: GenerationSettings, warm: bool = False) -> None:
        """Make every pool a generation on `target` with settings `s` uses, from any thread:
        a session's constructor and each settings change, and a server's start-up for its targets' defaults
        (vLLM allocates its KV cache at start-up too), so that no first request pays for writing a pool."""
        if s.method == "eagle" and s.kv_cache:     # its heads too, loaded here rather than inside a round
            self.registry.heads_for(self.registry.variants(target)[s.num_kv_heads] if s.num_kv_heads else target)
        for spec in self.pool_specs(target, s).values():
            self.pools.get(spec.key, spec.nbytes, spec.make, warm)

    def warm_up(self, target: LoadedModel, stopped: Callable[[], bool] = lambda: False) -> None:
        """Ahead of the first request, from any thread: what a first generation on `target` would otherwise pay
        inside it. Its weights (a fetched model's), its heads, and the pools of the default settings and of
        EAGLE drafting (the page's SmolLM2 demo); `stopped()` is asked between them. A pool over the KV memory
        budget is left out (logged): the requests that need it are refused with the reason."""
        target = self.registry.get(target.name)
        for s in WARM_SETTINGS:
            if stopped():
                return
            try:
                self.prepare_pools_for(target, s, warm=True)
            except PoolBudgetError as e:
                logger.warning("%s: a default pool not made at start-up: %s", target.name, e)

    def pool_snapshots(self) -> list:
        """Every KV pool now (engine/kv/cache.py's PoolSnapshot). Safe from any thread: one C-level copy of
        the managers (any thread may add or free a pool), and each snapshot may be a step old."""
        return [m.snapshot() for m in list(self.managers.values())]
