"""Typed events a generation yields. The web layer renders them; it never decides anything.

Every event is a small dataclass with a `type`; `to_dict()` gives the JSON form of docs/protocol.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    type = "event"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}


@dataclass
class Started(Event):
    type = "started"
    session_id: str
    settings: dict
    model: dict                 # name, num_hidden_layers, hidden_size, heads, kv heads, head_dim, vocab_size
    draft_model: dict | None
    prompt_tokens: list[dict]   # [{id, text}]
    unknown_characters: list[str] = field(default_factory=list)


@dataclass
class Prefill(Event):
    type = "prefill"
    model: str                  # which runner: target or draft
    num_tokens: int
    num_cached_tokens: int      # served by the prefix cache, not computed
    ms: float


@dataclass
class PrefillProgress(Event):
    """A chunk of a long prefill is done (chunked prefill, engine/serving/scheduler.py), and once more when the whole
    prefill is (num_computed = num_tokens); the target's `prefill` follows."""
    type = "prefill_progress"
    model: str                  # which runner: target or draft
    num_computed: int           # tokens of the prefill held so far (prefix-cache hits included)
    num_tokens: int             # tokens of the whole prefill
    ms: float                   # this chunk's step (with the other sessions' forwards batched into it)


@dataclass
class DraftProposed(Event):
    type = "draft"
    round: int
    method: str
    tokens: list[dict]          # [{id, text, q, parent}]: a token tree's nodes (parent -1: the root; a chain's i - 1)
    ms: float
    origin: dict | None = None  # where the drafter found it (suffix: source, match_len, score, probs per token)
    tree: dict | None = None    # a token tree's shape: topk (children per expanded node), depth (its deepest
    #                             node's), num_draft_tokens (the budget, SGLang's settings); None: a chain


@dataclass
class TokenResult(Event):
    """One position of a round: a draft token's verdict, or an emitted target token."""
    type = "token"
    round: int
    position: int               # 1-based position in the round
    id: int
    text: str
    status: str                 # accepted | rejected | resampled | bonus | target
    p: float | None             # target probability of this token (temperature 1 when greedy)
    q: float | None             # draft probability
    accept_prob: float | None   # min(1, p/q)
    r: float | None             # the uniform draw
    top_p: list = field(default_factory=list)   # [[id, text, prob]] top-5 of p
    top_q: list = field(default_factory=list)   # top-5 of q
    residual_top: list = field(default_factory=list)  # top-5 of norm(max(0, p - q)) for a resample
    # a block-verified draft token (engine/spec_decode/verify.py): h_i, which r is compared with, and what
    # token-by-token verification would have done with the same draws (accepted | rejected | unreached)
    stop_prob: float | None = None
    standard_status: str | None = None
    node: int | None = None     # a token tree's draft token: its index in the draft event's tokens (None: a chain's
    #                             draft, whose node is position - 1, or the round's own token)
    siblings: list = field(default_factory=list)   # a token tree's: the children tried at this position's parent,
    #                             in order, [{node, id, text, p, q, accept_prob, r, accepted, residual_top}]: p the
    #                             residual p' when tried, residual_top the top-5 of norm(max(0, p' - q)) after a rejection


@dataclass
class RoundDone(Event):
    type = "round"
    round: int
    num_draft_tokens: int
    num_accepted: int
    num_emitted: int
    verify_tokens: int          # positions in the target forward (k+1, or 1 for a plain step)
    target_ms: float
    draft_ms: float
    ms: float                   # engine time of the whole round
    node_status: list[str] = field(default_factory=list)   # a token tree's verdict per node, in the draft event's
    #                             order: accepted (the path) | rejected (tried, refused) | unreached; [] for a chain


@dataclass
class KVBlocks(Event):
    """Block events of this round, and the state of the pools this session uses."""
    type = "kv"
    events: list[dict]          # [{kind, block_id, pool}]
    pools: list[dict]           # [{name, num_blocks, used, cached, block_size, dtype, bytes_per_token, seq_blocks}]
    tree: dict | None = None    # a token tree's round in the target's cache (SessionFigures.tree_scratch): its
    #                             scratch rows as the verification forward wrote them, {pool, start, block_size,
    #                             rows: [{row, node, position, block_id, offset, kept_at}], freed_blocks}, kept_at
    #                             the position an accepted path's row moved to (None: freed), freed_blocks the
    #                             scratch blocks that emptied with them; None: no tree this round


@dataclass
class Metrics(Event):
    type = "metrics"
    values: dict


@dataclass
class SettingsApplied(Event):
    type = "settings_applied"
    changes: dict
    notes: list[str]
    cost_ms: float = 0.0


@dataclass
class Done(Event):
    type = "done"
    summary: dict


@dataclass
class Error(Event):
    type = "error"
    message: str


EVENT_TYPES = {cls.type: cls for cls in (Started, Prefill, PrefillProgress, DraftProposed, TokenResult, RoundDone,
                                         KVBlocks, Metrics, SettingsApplied, Done, Error)}


def event_from_dict(d: dict) -> Event:
    """The inverse of `to_dict()`: an event from its JSON form (a recorded run, replayed). Unknown types and
    fields raise ValueError."""
    cls = EVENT_TYPES.get(d.get("type")) if isinstance(d, dict) else None
    if cls is None:
        raise ValueError(f"not an event: {str(d)[:80]!r}")
    fields = {k: v for k, v in d.items() if k != "type"}
    try:
        return cls(**fields)
    except TypeError as e:
        raise ValueError(f"{d['type']} event: {e}") from None
