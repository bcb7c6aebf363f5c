"""Configuration of one server process: where the models are, who may connect, how many sessions.

Read from the environment (so that `uvicorn app.main:app` and the Docker image can be configured), or
built by `decoding-playground serve` from its options:

| variable | option of `serve` | default |
|---|---|---|
| DECODING_PLAYGROUND_MODELS_DIR | `--models-dir` | the repository's `models/` |
| DECODING_PLAYGROUND_ALLOWED_ORIGINS (comma-separated) | `--allowed-origin` (repeatable) | none: own origin only |
| DECODING_PLAYGROUND_ALLOWED_HOSTS (comma-separated) | `--allowed-host` (repeatable) | none: localhost, 127.0.0.1, [::1] and `--host` |
| DECODING_PLAYGROUND_MAX_SESSIONS | `--max-sessions` | 8 generating sessions |
| DECODING_PLAYGROUND_MAX_QUEUE | `--max-queue` | 32 starts waiting for a slot |
| DECODING_PLAYGROUND_MAX_CONNECTIONS | `--max-connections` | 1000 websockets (watchers included) |
| DECODING_PLAYGROUND_IDLE_TIMEOUT | `--idle-timeout` | 600 s without progress or a message |
| DECODING_PLAYGROUND_TOKEN | `--token` | none (workshop mode off) |
| DECODING_PLAYGROUND_MAX_NUM_BATCHED_TOKENS | `--max-num-batched-tokens` | the engine's (engine/serving/scheduler.py); 0: no chunked prefill |
| DECODING_PLAYGROUND_FRAME_ANCESTORS | `--frame-ancestors` | `*` (who may frame `/embed`) |
| DECODING_PLAYGROUND_THREADS | `--threads` | measured when SmolLM2 loads (engine/model/threads.py) |
| DECODING_PLAYGROUND_DEMO | – | `auto`: the page opens on SmolLM2 + chat + EAGLE when fetched; `character`: our models |
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.paths import PROJECT_DIR
from engine.external.openai_stream import configured_engines

ENV_PREFIX = "DECODING_PLAYGROUND_"

# A client message is at most MAX_MESSAGE_BYTES: a longer one is answered with an error event (the
# connection stays usable). uvicorn's own limit (`ws_max_size`) is set higher, to TRANSPORT_MAX_MESSAGE_BYTES,
# because uvicorn closes the connection (1009) on a message over it before the app sees the message; only
# beyond that transport limit does an oversized message close the connection.
MAX_MESSAGE_BYTES = 64 * 1024
TRANSPORT_MAX_MESSAGE_BYTES = 1024 * 1024


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
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)   # Host names besides the local ones
    bind_host: str = "127.0.0.1"          # `serve --host`: a name the server is reachable by (0.0.0.0: any IP)
    max_sessions: int = 8                 # generations at once (each holds KV blocks)
    embed_frame_ancestors: str = "*"
    max_queue: int = 32                   # starts waiting for a slot; beyond: close 1013 "busy, retry"
    max_connections: int = 1000           # websockets at once, watchers included; beyond: close 1013
    idle_timeout_s: float = 600.0         # a generation without progress or a client message is stopped
    token: str | None = None              # workshop mode: the shared secret of page, API and websockets
    max_num_batched_tokens: int | None = None   # tokens an engine step computes (chunked prefill); 0: off
    messages_per_s: float = 100.0         # per-connection message rate (token bucket) ...
    message_burst: int = 200              # ... and burst
    demo: str = "auto"                    # what the page opens on (app/views/page.py's demo_defaults)
    # external engines (app/ws/external.py): only the operator names their URLs, at start-up
    openai_engines: tuple[dict, ...] = ()  # [{url, model, metrics_url}] from serve --openai-url ...
    embedded_llamacpp: bool = False       # start llama.cpp's server on the fetched SmolLM2 GGUF (serve: yes)
    llamacpp_threads: int = 1
    threads: int | None = None            # weight-product threads of models that stream from memory; None: measured

    def __post_init__(self):
        object.__setattr__(self, "models_dir", Path(self.models_dir))
        object.__setattr__(self, "allowed_origins", tuple(normalize_origin(o) for o in self.allowed_origins))
        for name in ("max_sessions", "max_connections", "message_burst"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 0:
            raise ValueError("max_num_batched_tokens must be >= 0 (0: no chunked prefill), "
                             f"got {self.max_num_batched_tokens}")
        if self.threads is not None and not 1 <= self.threads <= 256:
            raise ValueError(f"threads must be between 1 and 256, got {self.threads}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.idle_timeout_s <= 0 or self.messages_per_s <= 0:
            raise ValueError("idle_timeout_s and messages_per_s must be > 0")
        if self.openai_engines:
            configured_engines(self.openai_engines, env={})     # raises ValueError for a URL that is not http(s)
        if self.token is not None:
            token = self.token.strip()
            if len(token) < 8 or not token.isascii() or not token.isprintable() or " " in token:
                raise ValueError("token: at least 8 printable ASCII characters without spaces")
            object.__setattr__(self, "token", token)
        if self.demo not in ("auto", "character"):
            raise ValueError(f"demo: auto or character, got {self.demo!r}")
        if any(c in self.embed_frame_ancestors for c in ";,\r\n"):
            raise ValueError("frame ancestors must be a space-separated CSP source list: "
                             f"{self.embed_frame_ancestors!r}")

    def with_overrides(self, **changes) -> "AppConfig":
        """This configuration with the given values (None: keep), e.g. from `serve`'s options."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env=None) -> "AppConfig":
        """The configuration the environment (or the mapping `env`) gives, defaults elsewhere."""
        read = EnvSettings() if env is None else EnvSettings.from_mapping(env)
        return cls(**{name: value for name, value in read.model_dump().items() if value is not None})


def _names(value):
    """A comma-separated list in one variable, as a tuple; empty items are dropped."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value


class EnvSettings(BaseSettings):
    """The DECODING_PLAYGROUND_* variables (unset or empty: the default), under AppConfig's field names."""
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore",
                                      populate_by_name=True)

    models_dir: Path | None = None
    allowed_origins: Annotated[tuple[str, ...] | None, NoDecode] = None
    allowed_hosts: Annotated[tuple[str, ...] | None, NoDecode] = None
    max_sessions: int | None = None
    max_queue: int | None = None
    max_connections: int | None = None
    idle_timeout_s: float | None = Field(None, validation_alias=AliasChoices(ENV_PREFIX + "IDLE_TIMEOUT",
                                                                             "idle_timeout"))
    token: str | None = None
    max_num_batched_tokens: int | None = None
    embed_frame_ancestors: str | None = Field(None, validation_alias=AliasChoices(ENV_PREFIX + "FRAME_ANCESTORS",
                                                                                  "frame_ancestors"))
    demo: str | None = None
    threads: int | None = None

    _split_names = field_validator("allowed_origins", "allowed_hosts", mode="before")(_names)

    @classmethod
    def from_mapping(cls, env) -> "EnvSettings":
        """The same from a mapping instead of the process's environment."""
        n = len(ENV_PREFIX)
        values = {k[n:].lower(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX) and v}
        return cls.model_validate(values)
