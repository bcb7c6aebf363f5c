"""Configuration of one server process: where the models are, who may connect, how many sessions.

Read from the environment (so that `uvicorn app.main:app` and the Docker image can be configured), or
built by `decoding-playground serve` from its options:

| variable | option of `serve` | default |
|---|---|---|
| DECODING_PLAYGROUND_MODELS_DIR | `--models-dir` | the repository's `models/` |
| DECODING_PLAYGROUND_ALLOWED_ORIGINS (comma-separated) | `--allowed-origin` (repeatable) | none: own origin only |
| DECODING_PLAYGROUND_MAX_SESSIONS | `--max-sessions` | 8 |
| DECODING_PLAYGROUND_FRAME_ANCESTORS | `--frame-ancestors` | `*` (who may frame `/embed`) |
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from app.paths import PROJECT_DIR

ENV_PREFIX = "DECODING_PLAYGROUND_"


def normalize_origin(origin: str) -> str:
    """`https://Example.org:443/` -> `https://example.org`: scheme://host[:port], lower case, no slash."""
    origin = origin.strip().rstrip("/")
    scheme, sep, rest = origin.partition("://")
    if not sep or not rest or "/" in rest:
        raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
    scheme, rest = scheme.lower(), rest.lower()
    default_port = {"http": ":80", "https": ":443"}.get(scheme)
    if default_port and rest.endswith(default_port):
        rest = rest[: -len(default_port)]
    return f"{scheme}://{rest}"


@dataclass(frozen=True)
class AppConfig:
    models_dir: Path = PROJECT_DIR / "models"
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)
    max_sessions: int = 8
    embed_frame_ancestors: str = "*"

    def __post_init__(self):
        object.__setattr__(self, "models_dir", Path(self.models_dir))
        object.__setattr__(self, "allowed_origins", tuple(normalize_origin(o) for o in self.allowed_origins))
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if any(c in self.embed_frame_ancestors for c in ";,\r\n"):
            raise ValueError("frame ancestors must be a space-separated CSP source list: "
                             f"{self.embed_frame_ancestors!r}")

    def with_overrides(self, **changes) -> "AppConfig":
        """This configuration with the given values (None: keep), e.g. from `serve`'s options."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env=None) -> "AppConfig":
        env = os.environ if env is None else env
        kwargs = {}
        if env.get(ENV_PREFIX + "MODELS_DIR"):
            kwargs["models_dir"] = Path(env[ENV_PREFIX + "MODELS_DIR"])
        if env.get(ENV_PREFIX + "ALLOWED_ORIGINS"):
            kwargs["allowed_origins"] = tuple(o for o in env[ENV_PREFIX + "ALLOWED_ORIGINS"].split(",") if o.strip())
        if env.get(ENV_PREFIX + "MAX_SESSIONS"):
            kwargs["max_sessions"] = int(env[ENV_PREFIX + "MAX_SESSIONS"])
        if env.get(ENV_PREFIX + "FRAME_ANCESTORS"):
            kwargs["embed_frame_ancestors"] = env[ENV_PREFIX + "FRAME_ANCESTORS"]
        return cls(**kwargs)
