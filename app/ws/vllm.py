"""vLLM servers the app starts (`serve --vllm`): one per variant (plain, n-gram, our EAGLE head, our draft model), offered in
the model selector from the start with a readiness flag, started one after another in the background.

Each vLLM server fixes its speculative method at start-up and holds about 3.6 GB (its three processes'
proportional set size, 1 GiB of it KV cache; docs/external-engines.md): the variants start in turn, not at
once, so that the page's first one (plain) is ready after one start-up, and `--vllm-variants` leaves out
the ones not wanted. A server that cannot start is offered as failed, with vLLM's own reason, and the rest
serves as before; all stop with the app.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from engine.external.vllm_rounds import StepRules
from engine.external.vllm_server import (KV_CACHE_GIB, NGRAM, SERVED_VARIANTS, VARIANTS, VllmServer, default_venv,
                                         error_excerpt, unavailable_reason)
from engine.model.chat import marked_prompt_tokens
from engine.model.fetched import cache_dir, model_dir
from engine.model.tokenizer import TextTokenizer
from engine.spec_decode.ngram import ngram_propose
from engine.training.vllm_draft_export import export_draft_for_vllm
from engine.training.vllm_export import export_eagle_for_vllm

logger = logging.getLogger(__name__)

TARGET = "smollm2-135m"
EXPORTS = {"eagle": (export_eagle_for_vllm, "heads", "our EAGLE head"),       # the drafters in vLLM's layout
           "draft_model": (export_draft_for_vllm, "drafts", "our draft model")}
WATCH_S = 2.0                 # how often a ready server is checked for life
MAX_RESTARTS = 3              # restarts of a server that died, per app


def chat_prompt_tokens(tokenizer: TextTokenizer):
    """The prompt's tokens as vLLM reads a chat request on SmolLM2 (its template is ours: the live tests compare
    them with vLLM's prompt_token_ids), the template's marked; None without a chat template."""
    template = tokenizer.chat_template
    if template is None:
        return None

    def tokens(prompt: str) -> list[dict]:
        text = template.prompt(prompt)
        ids = tokenizer.encode(text)
        return marked_prompt_tokens(ids, tokenizer.stream_texts(ids), text, template.user_span(prompt))
    return tokens


def step_rules(variant_key: str, tokenizer: TextTokenizer | None) -> StepRules:
    """How a client reads this variant's steps: the n-gram rule (ours is vLLM's), γ, token texts, prompt tokens."""
    spec = VARIANTS[variant_key].speculative
    texts = prompt = None
    if tokenizer is not None:
        special = {tokenizer.eos_token_id, tokenizer.bos_token_id}
        texts = lambda ids: ["" if i in special or i >= tokenizer.vocab_size else tokenizer.token_text(i)  # noqa: E731
                             for i in ids]
        prompt = chat_prompt_tokens(tokenizer)
    if spec is None:
        return StepRules(None, 0, None, texts, prompt)
    gamma = spec["num_speculative_tokens"]
    if spec["method"] == "ngram":
        lo, hi = NGRAM["prompt_lookup_min"], NGRAM["prompt_lookup_max"]
        return StepRules("ngram", gamma, lambda ids: len(ngram_propose(ids, gamma, lo, hi)), texts, prompt)
    return StepRules(spec["method"], gamma, None, texts, prompt)


class VllmFleet:
    """The vLLM servers of one app: made (and their engines offered) at once, started in turn."""

    def __init__(self, variants=SERVED_VARIANTS, threads: int = 1, eager: bool = True, cache: Path | None = None,
                 port: int | None = None):
        """port: the first server's (the next ones' follow), else free ones; the key: $DECODING_PLAYGROUND_VLLM_API_KEY
        (an operator's, for a client of their own, e.g. `bench serve --engine vllm`), else one per process."""
        cache = Path(cache or cache_dir())
        self.venv, self.model_dir, self.folder = default_venv(cache), model_dir(TARGET, cache), cache / "vllm"
        self.threads, self.eager = threads, eager
        self.servers: list[VllmServer] = []
        self.reason = unavailable_reason(self.venv, self.model_dir)
        self.task: asyncio.Task | None = None
        self.restarts: dict[str, int] = {}
        if self.reason:
            logger.error("!!! vLLM not offered: %s", self.reason)
            return
        tokenizer = TextTokenizer.from_file(self.model_dir / "tokenizer.json")
        api_key = os.environ.get("DECODING_PLAYGROUND_VLLM_API_KEY") or None
        for i, key in enumerate(variants):
            draft = None
            if key in EXPORTS:
                export, folder, what = EXPORTS[key]
                try:
                    draft = export(TARGET, self.folder / folder / TARGET, cache=cache)
                except (FileNotFoundError, ValueError) as e:
                    logger.error("!!! vLLM with %s not offered: %s", what, e)
                    continue
            server = VllmServer(VARIANTS[key], self.venv, self.model_dir, self.folder, threads, eager, draft,
                                rules=step_rules(key, tokenizer), port=port + i if port else None, api_key=api_key)
            self.servers.append(server)

    @property
    def engines(self) -> list:
        return [s.engine for s in self.servers]

    def start(self) -> None:
        """Start the servers one after another, in the background (the running event loop's task)."""
        if self.servers:
            self.task = asyncio.get_running_loop().create_task(self._start_in_turn())

    async def _start_in_turn(self) -> None:
        logger.warning("vLLM %s (%s): %d server(s) in turn (%s), %d thread(s) each, float32, %s mode, "
                       "%d GiB KV cache each, about 3.6 GB of memory each; loopback only, API key per process; "
                       "their own output: %s",
                       self.venv.name, self.venv, len(self.servers), ", ".join(s.variant.key for s in self.servers),
                       self.threads, "eager" if self.eager else "torch.compile", KV_CACHE_GIB,
                       self.servers[0].log_path.parent)
        for server in self.servers:
            t0 = time.monotonic()
            server.start()
            if await server.wait_ready():
                logger.warning("%s ready in %.0f s on %s", server.variant.label, time.monotonic() - t0,
                               server.engine.base_url)
            else:
                server.stop()
                logger.error("!!! %s could not start: %s (its log: %s)", server.variant.label, server.error,
                             server.failed_log_path)
        await self._watch()

    async def _watch(self) -> None:
        """A server that dies is said to have died (its runs end with an error naming it), then started again,
        at most MAX_RESTARTS times."""
        while True:
            await asyncio.sleep(WATCH_S)
            for server in self.servers:
                if server.state != "ready" or server.process.poll() is None:
                    continue
                server.state, server.error = "failed", (f"vLLM exited with code {server.process.returncode}: "
                                                        f"{error_excerpt(server.log_text())}")
                server.engine.description.update(server.describe())
                logger.error("!!! %s died: %s", server.variant.label, server.error)
                self.restarts[server.variant.key] = self.restarts.get(server.variant.key, 0) + 1
                if self.restarts[server.variant.key] <= MAX_RESTARTS:
                    server.stop()
                    server.start()
                    if await server.wait_ready():
                        logger.warning("%s is back (restart %d)", server.variant.label,
                                       self.restarts[server.variant.key])

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping anyway
                pass
        for server in self.servers:
            await asyncio.get_running_loop().run_in_executor(None, server.stop)

    def server(self, key: str) -> VllmServer | None:
        """The server of a variant (plain, ngram, eagle, draft_model), if it is offered."""
        return next((s for s in self.servers if s.variant.key == key), None)

    def state_of(self, name: str) -> str | None:
        """'starting', 'failed: ...' or None (ready, or not one of ours) for the selector and a start."""
        server = next((s for s in self.servers if s.engine.name == name), None)
        if server is None or server.state == "ready":
            return None
        if server.state == "failed":
            return f"failed: {server.error}"
        waited = f", {time.monotonic() - server.started_at:.0f} s so far" if server.state == "starting" else ""
        return f"{server.state}{waited}"
