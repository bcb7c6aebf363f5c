"""What the app holds for its lifetime: the configuration, the loaded models and the engine.

`Playground` is created once in the FastAPI lifespan and reached through `get_playground` (deps).
NOTE (invariant): `sessions` counts generations that hold (or may hold) KV blocks; a connection adds
one when it starts a generation and removes it after the generation's blocks are freed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from app.config import AppConfig
from engine.checkpoint import CheckpointError
from engine.registry import InferenceEngine, ModelRegistry

logger = logging.getLogger(__name__)


@dataclass
class Playground:
    config: AppConfig
    engine: InferenceEngine | None = None
    load_error: str | None = None
    sessions: int = 0
    connections: int = 0
    _open: set = field(default_factory=set)

    @classmethod
    def load(cls, config: AppConfig) -> "Playground":
        """Load the models once. A missing or broken model directory leaves the pages up, with the reason."""
        try:
            registry = ModelRegistry.from_dir(config.models_dir)
        except (FileNotFoundError, CheckpointError, KeyError, ValueError) as e:
            logger.error("no models loaded from %s: %s", config.models_dir, e)
            return cls(config, None, f"no models loaded from {config.models_dir}: {e}")
        return cls(config, InferenceEngine(registry, max_sessions=config.max_sessions))

    @property
    def registry(self) -> ModelRegistry | None:
        return self.engine.registry if self.engine else None

    def stats(self) -> dict:
        pools = self.engine.pool_stats() if self.engine else []
        return {"sessions": self.sessions, "connections": self.connections,
                "max_sessions": self.config.max_sessions,
                "kv_blocks_used": sum(p["used"] for p in pools),
                "kv_blocks_total": sum(p["num_blocks"] for p in pools), "pools": pools}

    def models(self) -> list[dict]:
        if self.registry is None:
            return []
        out = []
        for m in self.registry.models.values():
            d = m.describe()
            if m.role == "target":
                d["kv_head_variants"] = sorted(self.registry.variants(m))
                draft = self.registry.draft_for(m)
                d["draft_model"] = draft.name if draft else None
            out.append(d)
        return out
