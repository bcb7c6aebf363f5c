"""Configuration of one server process: where the models are, who may connect, how many sessions.

Read from the environment (so that `uvicorn app.main:app` and the Docker image can be configured), or
built by `decoding-playground serve` from its options:

| variable | option of `serve` | default |
|---|---|---|
| DECODING_PLAYGROUND_MODELS_DIR | `--models-dir` | the repository's `models/` |
| DECODING_PLAYGROUND_ALLOWED_ORIGINS (comma-separated) | `--allowed-origin` (repeatable) | none: own origin only |
| DECODING_PLAYGROUND_ALLOWED_HOSTS (comma-separated) | `--allowed-host` (repeatable) | none: localhost, 127.0.0.1, [::1] and `--host` |
| DECODING_PLAYGROUND_MAX_SESSIONS | `--max-sessions` | 8 generating sessions |
| DECODING_PLAYGROUND_KV_CACHE_MEMORY | `--kv-cache-memory` | twice the KV pools made at start-up (engine/serving/pools.py) |
| DECODING_PLAYGROUND_MAX_QUEUE | `--max-queue` | 32 starts waiting for a slot |
| DECODING_PLAYGROUND_MAX_CONNECTIONS | `--max-connections` | 1000 websockets (watchers included) |
| DECODING_PLAYGROUND_IDLE_TIMEOUT | `--idle-timeout` | 600 s without progress or a message |
| DECODING_PLAYGROUND_TOKEN | `--token` | none (workshop mode off) |
| DECODING_PLAYGROUND_MAX_NUM_BATCHED_TOKENS | `--max-num-batched-tokens` | none: chunks of about 250 ms by each model's measured speed (engine/serving/scheduler.py); 0: no chunked prefill |
| DECODING_PLAYGROUND_FRAME_ANCESTORS | `--frame-ancestors` | `*` (who may frame `/embed`) |
| DECODING_PLAYGROUND_THREADS | `--threads` | every core but one (engine/model/thread_choice.py) |
| DECODING_PLAYGROUND_SUFFIX_CACHE | `--suffix-cache` | `shared`: suffix decoding's global trees serve every session; `session`: each page its own |
| DECODING_PLAYGROUND_SUFFIX_DECODING_MAX_TREE_NODES | `--suffix-decoding-max-tree-nodes` | 1,000,000: nodes + cached responses of all global trees together |
| DECODING_PLAYGROUND_DEMO | – | `auto`: the page opens on SmolLM2 + chat + EAGLE when fetched; `character`: our models |
| DECODING_PLAYGROUND_VLLM (1/0) | `--vllm` / `--no-vllm` | off: start vLLM servers on the fetched SmolLM2 (app/ws/vllm.py) |
| DECODING_PLAYGROUND_VLLM_VENV | – | `make vllm`'s: $DECODING_PLAYGROUND_CACHE/vllm/venv |
| DECODING_PLAYGROUND_VLLM_API_KEY | – | vLLM's API key (environment only); default: one per process |
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.paths import PROJECT_DIR
from engine.external.openai_stream import configured_engines
from engine.external.vllm_server import SERVED_VARIANTS
from engine.spec_decode.suffix_caches import DEFAULT_MAX_TREE_NODES, MAX_TREE_NODES_RANGE, SCOPES
from engine.serving.settings import excerpt

ENV_PREFIX = "DECODING_PLAYGROUND_"

# A client message is at most MAX_MESSAGE_BYTES: a longer one is answered with an error event (the
# connection stays usable). uvicorn's own limit (`ws_max_size`) is set higher, to TRANSPORT_MAX_MESSAGE_BYTES,
# because uvicorn closes the connection (1009) on a message over it before the app sees the message; only
# beyond that transport limit does an oversized message close the connection.
MAX_MESSAGE_BYTES = 64 * 1024
TRANSPORT_MAX_MESSAGE_BYTES = 1024 * 1024


SIZE_UNITS = {"": 2 ** 30, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b)?\s*", re.IGNORECASE)


def memory_size(text: str | int) -> int:
    """`1.5GiB`, `800MiB`, `2GB` or a plain number of GiB -> bytes (ValueError if it is none of them)."""
    if isinstance(text, int):
        return text
    m = _SIZE.fullmatch(str(text)[:40])
    if not m:
        raise ValueError(f"a size such as 1.5GiB, 800MiB or 2GB (a plain number: GiB), got {excerpt(text)}")
    return int(float(m.group(1)) * SIZE_UNITS[(m.group(2) or "").lower()])


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


WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")      # `serve --host` values that bind every address
_REG_NAME = re.compile(r"(?:[a-z0-9\-._~!$&'()*+,;=]|%[0-9a-f]{2})+")


def host_name(host: str | None) -> str | None:
    """The name a Host header gives (RFC 9110 7.2: `uri-host [":" port]`, RFC 3986 3.2.2), lower case and without
    its port and the final dot of a fully qualified name (`localhost.` is `localhost`, as for browsers):
    `Example.org.:8000` -> `example.org`, `[::1]:8000` -> `[::1]`. None when it is not a Host value: userinfo
    (`a@b`), a port that is not a number up to 65535, an IPv6 literal that is not one, empty."""
    if host is None:
        return None
    host = host.strip(" \t").lower()
    if host.startswith("["):
        end = host.find("]")
        name, port = host[:end + 1], host[end + 1:]
        if end < 0 or (port and not port.startswith(":")) or not is_ip_literal(name):
            return None
        port = port[1:]
    else:
        name, _, port = host.partition(":")
        if name.endswith(".") and name != ".":
            name = name[:-1]
        if not _REG_NAME.fullmatch(name):
            return None
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return None
    return name


def is_ip_literal(name: str) -> bool:
    if name.startswith("["):
        if not name.endswith("]"):
            return False
        try:
            ipaddress.IPv6Address(name[1:-1])
            return True
        except ValueError:
            return False
    try:
        ipaddress.IPv4Address(name)
        return True
    except ValueError:
        return False


def configured_host(value: str) -> str:
    """A name given to `serve --host` or `--allowed-host` as the Host header would carry it (ValueError if it is
    not a host name)."""
    raw = value.strip()
    if ":" in raw and not raw.startswith("[") and raw.count(":") > 1:
        raw = f"[{raw}]"                    # a bare IPv6 address (::1)
    name = host_name(raw)
    if not name:
        raise ValueError(f"not a host name: {excerpt(value)}")
    return name


class ConfigError(ValueError):
    """A configuration value that cannot be: `field` is AppConfig's name for it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field, self.message = field_name, message


@contextmanager
def _field(name: str):
    """A ValueError raised inside is about this field."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(name, str(e)) from None


@dataclass(frozen=True)
class AppConfig:
    models_dir: Path = PROJECT_DIR / "models"
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)   # Host names besides the local ones
    bind_host: str = "127.0.0.1"          # `serve --host`: a name the server is reachable by (0.0.0.0: any IP)
    max_sessions: int = 8                 # generations at once (each holds KV blocks)
    kv_cache_memory: int | None = None    # bytes all KV pools may hold together; None: twice the start-up pools
    embed_frame_ancestors: str = "*"
    max_queue: int = 32                   # starts waiting for a slot; beyond: close 1013 "busy, retry"
    max_connections: int = 1000           # websockets at once, watchers included; beyond: close 1013
    idle_timeout_s: float = 600.0         # a generation without progress or a client message is stopped
    token: str | None = None              # workshop mode: the shared secret of page, API and websockets
    max_num_batched_tokens: int | None = None   # tokens an engine step computes; None: chunks sized in time; 0: off
    messages_per_s: float = 100.0         # per-connection message rate (token bucket) ...
    message_burst: int = 200              # ... and burst
    demo: str = "auto"                    # what the page opens on (app/views/page.py's demo_defaults)
    # external engines (app/ws/external.py): only the operator names their URLs, at start-up
    openai_engines: tuple[dict, ...] = ()  # [{url, model, metrics_url}] from serve --openai-url ...
    embedded_llamacpp: bool = False       # start llama.cpp's server on the fetched SmolLM2 GGUF (serve: yes)
    llamacpp_threads: int = 1
    vllm: bool = False                    # start vLLM servers on the fetched SmolLM2 (serve --vllm)
    vllm_threads: int = 1
    vllm_variants: tuple[str, ...] = SERVED_VARIANTS    # plain, ngram, eagle, draft_model
    vllm_port: int | None = None          # the first vLLM server's loopback port (the next ones' follow)
    vllm_compile: bool = False            # torch.compile: faster decode, far longer start-up (docs/external-engines.md)
    threads: int | None = None            # weight-product threads of models that stream from memory; None: the rule
    curve_at_start: bool = False          # measure the demo model's verify curve at start-up (serve: yes)
    freeze_gc: bool = False               # once the models are loaded, the cycle collector skips them (serve: yes)
    suffix_cache: str = "shared"          # suffix decoding's global trees: shared by every session, or per session
    suffix_decoding_max_tree_nodes: int = DEFAULT_MAX_TREE_NODES   # their memory bound (engine/spec_decode/suffix_caches.py)

    def __post_init__(self):
        object.__setattr__(self, "models_dir", Path(self.models_dir))
        with _field("allowed_origins"):
            object.__setattr__(self, "allowed_origins", tuple(normalize_origin(o) for o in self.allowed_origins))
        if self.kv_cache_memory is not None:
            with _field("kv_cache_memory"):
                object.__setattr__(self, "kv_cache_memory", memory_size(self.kv_cache_memory))
            if self.kv_cache_memory < 2 ** 20:
                raise ConfigError("kv_cache_memory", f"at least 1MiB, got {self.kv_cache_memory} bytes")
        for name in ("max_sessions", "max_connections", "message_burst"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"at least 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 0:
            raise ConfigError("max_num_batched_tokens", f"at least 0 (0: no chunked prefill), got "
                                                        f"{self.max_num_batched_tokens}")
        if self.threads is not None and not 1 <= self.threads <= 256:
            raise ConfigError("threads", f"1 to 256, got {self.threads}")
        if self.max_queue < 0:
            raise ConfigError("max_queue", f"at least 0, got {self.max_queue}")
        for name in ("idle_timeout_s", "messages_per_s"):
            if not getattr(self, name) > 0:                      # (NaN too)
                raise ConfigError(name, f"more than 0, got {getattr(self, name)}")
        if self.openai_engines:
            with _field("openai_engines"):
                configured_engines(self.openai_engines, env={})     # a URL that is not http(s)
        if self.token is not None:
            token = self.token.strip()
            if len(token) < 8 or not token.isascii() or not token.isprintable() or " " in token:
                raise ConfigError("token", "at least 8 printable ASCII characters without spaces")
            object.__setattr__(self, "token", token)
        with _field("allowed_hosts"):
            for name in self.allowed_hosts:
                if name != "*":
                    configured_host(name)
        if self.bind_host not in WILDCARD_BINDS:
            with _field("bind_host"):
                configured_host(self.bind_host)
        if not set(self.vllm_variants) <= set(SERVED_VARIANTS) or not self.vllm_variants:
            raise ConfigError("vllm_variants", f"some of {', '.join(SERVED_VARIANTS)}, got "
                                               f"{excerpt(','.join(self.vllm_variants))}")
        if self.vllm_threads < 1:
            raise ConfigError("vllm_threads", f"at least 1, got {self.vllm_threads}")
        if self.suffix_cache not in SCOPES:
            raise ConfigError("suffix_cache", f"shared or session, got {excerpt(self.suffix_cache)}")
        low, high = MAX_TREE_NODES_RANGE
        if not low <= self.suffix_decoding_max_tree_nodes <= high:
            raise ConfigError("suffix_decoding_max_tree_nodes",
                              f"{low:,} to {high:,}, got {self.suffix_decoding_max_tree_nodes}")
        if self.demo not in ("auto", "character"):
            raise ConfigError("demo", f"auto or character, got {excerpt(self.demo)}")
        if any(c in self.embed_frame_ancestors for c in ";,\r\n"):
            raise ConfigError("embed_frame_ancestors", "a space-separated CSP source list, got "
                                                       f"{excerpt(self.embed_frame_ancestors)}")

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
    kv_cache_memory: str | None = None
    max_queue: int | None = None
    max_connections: int | None = None
    idle_timeout_s: float | None = Field(None, validation_alias=AliasChoices(ENV_PREFIX + "IDLE_TIMEOUT",
                                                                             "idle_timeout"))
    token: str | None = None
    max_num_batched_tokens: int | None = None
    embed_frame_ancestors: str | None = Field(None, validation_alias=AliasChoices(ENV_PREFIX + "FRAME_ANCESTORS",
                                                                                  "frame_ancestors"))
    demo: str | None = None
    vllm: bool | None = None
    threads: int | None = None
    suffix_cache: str | None = None
    suffix_decoding_max_tree_nodes: int | None = None

    _split_names = field_validator("allowed_origins", "allowed_hosts", mode="before")(_names)

    @classmethod
    def from_mapping(cls, env) -> "EnvSettings":
        """The same from a mapping instead of the process's environment."""
        n = len(ENV_PREFIX)
        values = {k[n:].lower(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX) and v}
        return cls.model_validate(values)
