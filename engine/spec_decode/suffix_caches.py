"""Where suffix decoding's global trees live: one engine's (a server's, or one `generate`'s) suffix caches,
shared by every session or kept per session, all within one memory bound. The trees and the rule:
engine/spec_decode/suffix.py; the proposer that drafts from them: engine/spec_decode/suffix_proposer.py.

    caches = SuffixCaches(scope="shared", max_tree_nodes=1_000_000)
    request = caches.start(model, TreeShape(24, 10000), context, scope_id)
    request.add(new_tokens); request.speculate(context, k, max_spec_factor, min_token_prob); request.stop()

A global tree belongs to a model and a tree shape (`suffix_decoding_max_tree_depth`,
`suffix_decoding_max_cached_requests`): requests on the same model with the same shape share it, so at the
defaults every request of the server drafts from one tree per model, as every request of a vLLM server drafts
from its one global tree. A request's output enters that tree token by token and stays there when the request
ends, until evicted.

Scopes. With scope "shared" (serve's default) the trees serve everyone: in a shared room a draft may come from
another person's answer. With scope "session" each scope (`session_scope`: the app opens one per page, all the
websocket connections of one presenter key) has trees of its own, dropped when the scope closes: it drafts only
from its own earlier requests. A request started outside any scope then shares with nobody.

NOTE (invariants, after every call; one lock serialises them, so that any thread may call):
- the nodes of every global tree (every model, shape and scope) plus their cached responses are at most
  `max_tree_nodes`; past it, the response that started first of all is evicted first, whichever tree holds it
  (requests are numbered in the order they start);
- each tree keeps its own bounds too (at most its shape's max cached requests, first in first out);
- a tree that holds nothing and serves no active request is dropped.
A request's own tree (over its prompt and output) is not counted here: it holds up to max_tree_depth nodes per
token of its context and goes when the request stops.
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import count

from .suffix import SuffixDecodingCache, SuffixDraft

SCOPES = ("shared", "session")
DEFAULT_MAX_TREE_NODES = 1_000_000
MAX_TREE_NODES_RANGE = (1, 100_000_000)

# The session scope of the generations started in this context (and in the worker threads that copy it): set by
# `SuffixCaches.session_scope`, read when a generation starts (engine/serving/session.py).
suffix_cache_scope: ContextVar[object] = ContextVar("suffix_cache_scope", default=None)


@dataclass(frozen=True)
class TreeShape:
    """What a global tree is made with; requests share a tree only with requests of the same shape."""
    max_tree_depth: int                  # suffix_decoding_max_tree_depth
    max_cached_requests: int             # suffix_decoding_max_cached_requests (0: no global tree)


class SuffixCaches:
    """The global suffix trees of one engine, by (model, shape, scope). See the module docstring."""

    def __init__(self, scope: str = "shared", max_tree_nodes: int = DEFAULT_MAX_TREE_NODES):
        if scope not in SCOPES:
            raise ValueError(f"suffix cache scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        low, high = MAX_TREE_NODES_RANGE
        if not low <= max_tree_nodes <= high:
            raise ValueError(f"suffix_decoding_max_tree_nodes must be in [{low:,}, {high:,}], got {max_tree_nodes}")
        self.scope, self.max_tree_nodes = scope, max_tree_nodes
        self.lock = threading.Lock()
        self._trees: dict[tuple, SuffixDecodingCache] = {}      # (model, shape, scope_id) -> its cache
        self._units = 0                   # nodes + cached responses of every tree: what max_tree_nodes bounds
        self._scope_users: Counter = Counter()                   # scope_id -> scopes open with it
        self._request_numbers = count()

    # --- scopes ---------------------------------------------------------------------------------------------
    @contextmanager
    def session_scope(self, scope_id):
        """Generations started inside (this context and threads that copy it) belong to `scope_id`. Scopes may
        nest and repeat (a page that reconnects with its key); a scope's trees go when its last user leaves.
        With scope "shared" it changes nothing."""
        token = suffix_cache_scope.set(scope_id)
        with self.lock:
            self._scope_users[scope_id] += 1
        try:
            yield
        finally:
            suffix_cache_scope.reset(token)
            with self.lock:
                self._scope_users[scope_id] -= 1
                if self._scope_users[scope_id] <= 0:
                    del self._scope_users[scope_id]
                    self._drop_scope(scope_id)

    def _drop_scope(self, scope_id) -> None:
        for key in [k for k in self._trees if k[2] == scope_id and scope_id is not None]:
            self._units -= _units(self._trees.pop(key))

    # --- requests -------------------------------------------------------------------------------------------
    def start(self, model: str, shape: TreeShape, context: list[int], scope_id=None) -> "SuffixRequest":
        """A request whose own tree starts over `context` (its prompt, or its prompt and the output so far when
        drafting starts mid-run); its later tokens go into the global tree of its model and shape."""
        number = next(self._request_numbers)
        private = self.scope == "session" and scope_id is None
        if self.scope == "shared":
            scope_id = None
        elif private:
            scope_id = ("run", number)            # outside any session: a tree of its own, gone when it stops
        key = (model, shape, scope_id)
        with self.lock:
            cache = self._trees.get(key)
            if cache is None:
                cache = self._trees[key] = SuffixDecodingCache(shape.max_tree_depth, shape.max_cached_requests,
                                                               self.max_tree_nodes)
            before = _units(cache)
            cache.start_request(number, context)
            self._settle(cache, before)
        return SuffixRequest(self, key, cache, number, private)

    def add(self, request: "SuffixRequest", token_ids: list[int]) -> None:
        with self.lock:
            before = _units(request.cache)
            request.cache.add_active_response(request.number, token_ids)
            if self._trees.get(request.key) is request.cache:    # else its scope closed: it drafts on alone
                self._settle(request.cache, before)

    def stop(self, request: "SuffixRequest") -> None:
        with self.lock:
            request.cache.stop_request(request.number)
            if self._trees.get(request.key) is not request.cache:
                return
            if request.private:
                self._units -= _units(self._trees.pop(request.key))
            else:
                self._forget_if_empty(request.key)

    def _settle(self, cache: SuffixDecodingCache, before: int) -> None:
        """After `cache` changed from `before` units: the bound kept (the oldest response of all evicted first)."""
        self._units += _units(cache) - before
        while self._units > self.max_tree_nodes:
            key, oldest = min(((k, c) for k, c in self._trees.items() if c.cached_requests),
                              key=lambda kc: _first_cached(kc[1]))
            before = _units(oldest)
            oldest.evict_cached_response(_first_cached(oldest))
            self._units += _units(oldest) - before
            self._forget_if_empty(key)

    def _forget_if_empty(self, key) -> None:
        cache = self._trees.get(key)
        if cache is not None and not cache.active_requests and not cache.cached_requests:
            del self._trees[key]

    # --- figures --------------------------------------------------------------------------------------------
    def sizes(self) -> dict[str, dict]:
        """model -> {"nodes", "cached_requests", "trees"} over its global trees (every shape and scope)."""
        out: dict[str, dict] = {}
        with self.lock:
            for (model, _, _), cache in self._trees.items():
                row = out.setdefault(model, {"nodes": 0, "cached_requests": 0, "trees": 0})
                row["nodes"] += cache.global_tree_nodes
                row["cached_requests"] += len(cache.cached_requests)
                row["trees"] += 1
        return out

    @property
    def units(self) -> int:
        """Nodes plus cached responses of every global tree: at most max_tree_nodes."""
        return self._units


def _units(cache: SuffixDecodingCache) -> int:
    return cache.global_tree_nodes + len(cache.cached_requests)


def _first_cached(cache: SuffixDecodingCache) -> int:
    return next(iter(cache.cached_requests))


class SuffixRequest:
    """One generation's handle on its cache: its own tree and its place in a global tree."""

    def __init__(self, caches: SuffixCaches, key: tuple, cache: SuffixDecodingCache, number: int, private: bool):
        self.caches, self.key, self.cache, self.number, self.private = caches, key, cache, number, private
        self.active = True

    def add(self, token_ids: list[int]) -> None:
        """Verified output tokens: into the request's own tree and the global tree."""
        if token_ids and self.active:
            self.caches.add(self, token_ids)

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> SuffixDraft:
        with self.caches.lock:
            return self.cache.speculate(self.number, context, max_spec_tokens, max_spec_factor, min_token_prob)

    def stop(self) -> None:
        """The request is done: its own tree goes; its output stays in the global tree until evicted (idempotent)."""
        if self.active:
            self.active = False
            self.caches.stop(self)
