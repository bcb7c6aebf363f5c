"""A model runner: one sequence of one model, with or without a KV cache.

`extend(tokens)` feeds new tokens after those already held and returns their logits; `truncate(n)`
rolls back. After each forward, `hidden` [n, C] holds the last hidden states of the positions computed,
from `hidden_p0` on (engine.model.llama.forward's with_hidden: what draft heads read). `PagedRunner` keeps K/V
in a paged cache (engine/kv/cache.py); `RecomputeRunner` keeps only the token ids and recomputes the whole
sequence on every call (the seed's no-cache baseline).

A token tree's verification is `extend(root and nodes, mask=tree mask, positions=root + depth)`; after it,
`keep_tree_path(rows)` keeps the accepted path's rows (the root's and its nodes') as the sequence and drops the
others, in both runners; `hidden` then holds the kept rows' states, in that order.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from ..model.llama import Model, causal_mask, forward
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
    layer's input instead of the tokens' embeddings (an EAGLE head's); positions: the tokens' RoPE positions, a
    token tree's (engine.model.llama.forward; None: one after the other). Any of them keeps a request out of
    batches."""
    __slots__ = ("runner", "tokens", "mask", "last_only", "role", "num_tokens", "inputs_embeds", "positions",
                 "seconds")

    def __init__(self, runner, tokens, mask=None, last_only: bool = False, role: str = "target",
                 inputs_embeds=None, positions=None):
        self.runner, self.tokens, self.mask, self.last_only = runner, list(tokens), mask, last_only
        self.role, self.num_tokens = role, runner.num_tokens + len(self.tokens)   # held once it is done
        self.inputs_embeds, self.positions = inputs_embeds, positions
        self.seconds = 0.0          # its time on the engine clock once it has run (a batch's whole forward)

    @property
    def causal(self) -> bool:
        """The plain causal mask at consecutive positions: what batched and chunked forwards
        (engine/serving/scheduler.py) assume."""
        return self.mask is None and self.positions is None

    def run(self):
        clock = clock_for(self.runner.model)
        t = clock()
        try:
            # only what was given: a recompute runner takes no inputs_embeds
            extras = {name: value for name, value in (("inputs_embeds", self.inputs_embeds),
                                                      ("positions", self.positions)) if value is not None}
            return self.runner.extend(self.tokens, self.mask, self.last_only, **extras)
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

    def extend(self, tokens, mask=None, last_only: bool = False, inputs_embeds=None, positions=None):
        """Feed tokens; the first call on an empty sequence may reuse cached prefix blocks.

        Returns logits for the positions actually computed (the last one is always computed), or for the
        last position only. mask, inputs_embeds, positions: see engine.model.llama.forward (no prefix reuse
        with them); with positions, a token tree's rows, pending until `keep_tree_path`.
        """
        tokens, p0, kv = self.prepare(tokens, tree=positions is not None)
        clock = clock_for(self.model)
        t = clock()
        logits, hidden = forward(self.model, tokens, p0, kv, mask=mask, positions=positions, last_only=last_only,
                                 with_hidden=True, inputs_embeds=inputs_embeds)
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

    def prepare(self, tokens, tree: bool = False):  # -> (tokens to compute, p0, SequenceKV): the slots for a forward
        if tree:                                     # a tree's rows are no prefix of anything
            p0 = self.hidden_p0 = self.seq.num_tokens
            return np.asarray(tokens), p0, self.manager.append_tree_slots(self.seq, list(tokens))
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

    def keep_tree_path(self, rows) -> None:
        """After a tree's forward: keep its rows `rows` (the root's, row 0, then the accepted nodes'; node i is
        row i + 1) in order as the sequence's last tokens, and free the others (KVCacheManager.keep_tree_path)."""
        self.manager.keep_tree_path(self.seq, rows)
        if self.hidden is not None:
            self.hidden = self.hidden[list(rows)]
        self.matched = self.seq.num_tokens > 0

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
        self.tree_start = None      # a token tree's rows are the tokens from here on, until keep_tree_path

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def extend(self, tokens, mask=None, last_only: bool = False, positions=None):
        """mask: applied to a token tree's rows (positions given); otherwise each call recomputes causally."""
        tokens, T = list(tokens), len(self.token_ids)
        self.token_ids.extend(tokens)
        full_mask = full_positions = None
        if positions is not None:                  # the context causal, then the tree's rows as the mask says
            n = len(tokens)
            full_mask = causal_mask(T + n).copy()
            full_mask[T:, T:] = causal_mask(n) if mask is None else mask
            full_positions = np.concatenate([np.arange(T), np.asarray(positions, np.int64)])
            self.tree_start = T
        clock = clock_for(self.model)
        t = clock()
        logits, self.hidden = forward(self.model, np.asarray(self.token_ids), 0, None, mask=full_mask,
                                      positions=full_positions, last_only=last_only, with_hidden=True)
        self.forward_s += clock() - t
        self.forward_calls += 1
        return logits if last_only else logits[T:]

    def keep_tree_path(self, rows) -> None:
        """As PagedRunner.keep_tree_path: the tree's rows `rows` stay, in that order; `hidden` (of the whole
        sequence) follows."""
        start, rows = self.tree_start, list(rows)
        if start is None:
            raise ValueError("no token tree pending: keep_tree_path follows a tree's forward")
        kept = [start + r for r in rows]
        self.token_ids[start:] = [self.token_ids[i] for i in kept]
        if self.hidden is not None:
            self.hidden = self.hidden[list(range(start)) + kept]
        self.tree_start = None

    def truncate(self, n: int) -> None:
        del self.token_ids[n:]
        self.tree_start = None

    def commit(self) -> None:
        pass

    def free(self) -> None:
        self.token_ids.clear()
