"""A model runner: one sequence of one model, with or without a KV cache.

`extend(tokens)` feeds new tokens after those already held and returns their logits; `truncate(n)`
rolls back. After each forward, `hidden` [n, C] holds the last hidden states of the positions computed,
from `hidden_p0` on (engine.model.llama.forward's with_hidden: what draft heads read). `PagedRunner` keeps K/V
in a paged cache (engine/kv/cache.py); `RecomputeRunner` keeps only the token ids and recomputes the whole
sequence on every call (the seed's no-cache baseline).
"""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from ..model.llama import Model, forward
from ..model.threads import shared_clock, threads
from .cache import KVCacheManager


def _blas_in_this_thread() -> bool:
    return all(os.environ.get(v) == "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"))


def clock_for(model) -> Callable[[], float]:
    """The clock a stretch of `model`'s engine work is timed on (its start and its end on the same one): the
    calling thread's CPU time, so that waiting (for the GIL, for a core) counts nothing, plus the helpers' CPU
    time beyond its own in the products they shared (a model whose weight products are shared,
    engine/model/threads.py: `shared_clock`); the wall clock when BLAS runs threads of its own, which neither
    shows."""
    if not _blas_in_this_thread():
        return time.perf_counter
    return shared_clock if threads() > 1 and getattr(model, "layout", "arrays") != "arrays" else time.thread_time


class ForwardRequest:
    """A forward a session needs: `tokens` fed after what `runner` holds. A scheduler may run several
    requests of the same model as one batched computation, and a long one in chunks over several steps
    (`role`, target or draft, names it then); alone, `run()` does it. mask: [n, n], which of the new tokens
    each new token sees (engine.model.llama.attention; None: the causal mask); inputs_embeds: the first
    layer's input instead of the tokens' embeddings (an EAGLE head's). Either keeps a request out of batches."""
    __slots__ = ("runner", "tokens", "mask", "last_only", "role", "num_tokens", "inputs_embeds", "seconds")

    def __init__(self, runner, tokens, mask=None, last_only: bool = False, role: str = "target",
                 inputs_embeds=None):
        self.runner, self.tokens, self.mask, self.last_only = runner, list(tokens), mask, last_only
        self.role, self.num_tokens = role, runner.num_tokens + len(self.tokens)   # held once it is done
        self.inputs_embeds = inputs_embeds
        self.seconds = 0.0          # its time on the engine clock once it has run (a batch's whole forward)

    @property
    def causal(self) -> bool:
        """The plain causal mask: what batched and chunked forwards (engine/serving/scheduler.py) assume."""
        return self.mask is None

    def run(self):
        clock = clock_for(self.runner.model)
        t = clock()
        try:
            if self.inputs_embeds is not None:
                return self.runner.extend(self.tokens, self.mask, self.last_only, inputs_embeds=self.inputs_embeds)
            return self.runner.extend(self.tokens, self.mask, self.last_only)
        finally:
            self.seconds += clock() - t


ROUND_BOUNDARY = "round-boundary"   # what a session yields between rounds (where pacing may hold it)


class PagedRunner:
    def __init__(self, model: Model, manager: KVCacheManager, prefix_caching: bool = True):
        self.model, self.manager, self.prefix_caching = model, manager, prefix_caching
        self.seq = manager.new_sequence()
        self.forward_calls = 0
        self.forward_s = 0.0
        self.cached_tokens = 0      # tokens served by the prefix cache (never computed here)
        self.hidden, self.hidden_p0 = None, 0
        self.hidden_chunks = []     # a chunked prefill's earlier chunks: (p0, hidden), joined when it is done
        self.matched = False        # the prefix cache was asked (once, before the first forward)

    @property
    def num_tokens(self) -> int:
        return self.seq.num_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    def extend(self, tokens, mask=None, last_only: bool = False, inputs_embeds=None):
        """Feed tokens; the first call on an empty sequence may reuse cached prefix blocks.

        Returns logits for the positions actually computed (the last one is always computed), or for the
        last position only. mask, inputs_embeds: see engine.model.llama.forward (no prefix reuse with them).
        """
        tokens, p0, kv = self.prepare(tokens)
        clock = clock_for(self.model)
        t = clock()
        logits, hidden = forward(self.model, tokens, p0, kv, mask=mask, last_only=last_only, with_hidden=True,
                                 inputs_embeds=inputs_embeds)
        self.finish(clock() - t, hidden)
        return logits

    def match_prefix(self, tokens) -> list:  # -> the tokens still to compute
        """On an empty sequence, share the cached blocks that start `tokens` (the prefix cache)."""
        tokens = list(tokens)
        if self.seq.num_tokens == 0 and not self.matched and self.prefix_caching and len(tokens) > 1:
            self.cached_tokens = self.manager.match_prefix(self.seq, tokens)
            tokens = tokens[self.cached_tokens:]
        self.matched = True
        return tokens

    def prepare(self, tokens):  # -> (tokens to compute, p0, SequenceKV): the slots for a forward
        tokens = self.match_prefix(tokens)
        p0 = self.hidden_p0 = self.seq.num_tokens
        return np.asarray(tokens), p0, self.manager.append_slots(self.seq, tokens)

    def finish(self, seconds: float, hidden=None, chunk: bool = False) -> None:
        """After a forward; `chunk`: one chunk of a longer forward, whose hidden states are kept until the
        last chunk, so that `hidden` covers the whole forward from `hidden_p0` on (what draft heads read)."""
        self.forward_s += seconds
        self.forward_calls += 1
        if chunk:
            self.hidden_chunks.append((self.hidden_p0, hidden))
            return
        if self.hidden_chunks and hidden is not None:
            self.hidden_p0 = self.hidden_chunks[0][0]
            hidden = np.concatenate([h for _, h in self.hidden_chunks] + [hidden])
        self.hidden_chunks = []
        self.hidden = hidden

    def truncate(self, n: int) -> None:
        if n < self.seq.num_tokens:
            self.manager.truncate(self.seq, n)
            self.matched = n > 0

    def commit(self) -> None:
        if self.prefix_caching:
            self.manager.commit(self.seq)

    def free(self) -> None:
        self.manager.free(self.seq)

    def move_to(self, manager: KVCacheManager) -> "PagedRunner":
        """The same tokens in another cache (another dtype or block size): K/V converted, not recomputed."""
        new = PagedRunner(self.model, manager, self.prefix_caching)
        tokens = self.seq.token_ids
        if tokens:
            src = self.manager.append_slots(self.seq, [])        # read view of all slots held
            dst = manager.append_slots(new.seq, tokens)
            for layer in range(self.model.cfg.num_hidden_layers):
                kv = self.manager.store.read(layer, src.read_slots)          # [2, nkv, T, hd] float32
                manager.store.write(layer, dst.write_slots, kv.transpose(2, 0, 1, 3))
        new.forward_calls, new.forward_s = self.forward_calls, self.forward_s
        new.commit()
        self.free()
        return new


class RecomputeRunner:
    """No KV cache: every call recomputes every position (what the cache saves is visible)."""

    def __init__(self, model: Model):
        self.model = model
        self.token_ids: list[int] = []
        self.forward_calls = 0
        self.forward_s = 0.0
        self.cached_tokens = 0
        self.hidden, self.hidden_p0 = None, 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def extend(self, tokens, mask=None, last_only: bool = False):  # mask: not applied, each call recomputes causally
        tokens = list(tokens)
        self.token_ids.extend(tokens)
        clock = clock_for(self.model)
        t = clock()
        logits, self.hidden = forward(self.model, np.asarray(self.token_ids), 0, None, last_only=last_only,
                                      with_hidden=True)
        self.forward_s += clock() - t
        self.forward_calls += 1
        return logits if last_only else logits[len(self.token_ids) - len(tokens):]

    def truncate(self, n: int) -> None:
        del self.token_ids[n:]

    def commit(self) -> None:
        pass

    def free(self) -> None:
        self.token_ids.clear()
