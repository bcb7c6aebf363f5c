"""What a round asks of a proposer, what it gets back, and the contract every proposer keeps.

    draft = yield from proposer.propose(tokens, DraftParams(k, temperature, top_p), rng)

A `Draft` is a token tree. Each node holds its token, its parent (-1: the root, the context's last token),
its depth and q at its parent, the draft distribution its token was drawn from there. A chain is the tree
whose nodes each have one child. The target verifies a draft in one
forward over the root and every node, each node seeing the context and its own ancestors only
(`attention_mask`; trees' verification: engine/spec_decode/tree_verify.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from ..kv.runner import ForwardRequest
from .sampling import draft_confidence


def tree_mask(parents) -> np.ndarray:  # [n] -> [n, n] bool: mask[i, j] = node i sees node j
    """Tree attention among the draft's nodes: a node sees itself and its ancestors (and, outside this mask,
    the committed context and the root). A chain's mask is the causal (lower-triangular) one."""
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    for i, parent in enumerate(parents):        # topological order: a parent's row is complete before its child's
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def tree_depths(parents) -> np.ndarray:  # [n] -> [n], 1 for a child of the root
    depth = np.zeros(len(parents), np.int64)
    for i, parent in enumerate(parents):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    return depth


def tree_positions(parents, context_len: int) -> np.ndarray:  # [n] -> [n] positions for RoPE
    """A node's position is that of its token along its own path: context_len + depth, where context_len is
    the root's position (the tokens committed before it). Siblings share a position."""
    return context_len + tree_depths(parents)


def verification_positions(parents, root_position: int) -> np.ndarray:  # [n] -> [n + 1]
    """The RoPE positions of a tree's verification forward (engine.model.llama.forward's `positions`): the root
    at its own position, then each node at root_position + depth. A chain's are consecutive."""
    return np.concatenate([[root_position], tree_positions(parents, root_position)]).astype(np.int64)


def children_of(parents) -> dict[int, list[int]]:
    """node (-1: the root) -> its children in node order, the order in which verification tries them."""
    out: dict[int, list[int]] = {-1: []}
    for i, parent in enumerate(parents):
        out.setdefault(i, [])
        out[parent].append(i)
    return out


@dataclass
class Draft:
    """A round's draft tokens as a tree.

    NOTE (invariants): nodes are in topological order (a parent before its children); q[i] is a distribution
    with q[i, tokens[i]] > 0. In a chain node i is draft position i + 1.
    """
    tokens: list[int]                     # [n]
    parents: list[int]                    # [n] the parent's node index; -1 for the root
    q: np.ndarray                         # [n, V] q at each node's parent (a point mass: greedy, lookup)
    display_logits: np.ndarray | None = None   # [n, V] the drafter's logits there (None: it has none, n-gram
    #                                            lookup): what the token inspector shows as q when decoding is
    #                                            greedy and q itself is a point mass
    forward_calls: int = 0                # drafting forwards this draft cost (the statistics' draft_forward_calls)
    origin: dict | None = None            # where the drafter found it, shown with it (suffix decoding: its source,
    #                                       match_len, score and each token's probs; engine/spec_decode/suffix_proposer.py)

    def __post_init__(self):
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} is neither an earlier node nor the root (-1)")

    @classmethod
    def chain(cls, tokens: list[int], q, display_logits=None, forward_calls: int = 0, origin=None) -> "Draft":
        """Tokens drafted one after the other: node i's parent is node i - 1."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q, display_logits, forward_calls, origin)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> np.ndarray:  # [n], 1 for a child of the root
        return tree_depths(self.parents)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def attention_mask(self):  # -> [n + 1, n + 1] or None
        """The verification forward's mask (engine.model.llama.attention) over the root, then the nodes: each sees
        the root, its ancestors and itself. None for a chain: its mask is the causal one, which the forward
        applies anyway (and batches with other sessions' forwards)."""
        if self.is_chain:
            return None
        n = len(self.tokens)
        sees = np.ones((n + 1, n + 1), bool)
        sees[0, 1:] = False
        sees[1:, 1:] = tree_mask(self.parents)
        return np.where(sees, 0.0, -np.inf).astype(np.float32)

    def verification_positions(self, root_position: int):  # -> [n + 1] or None
        """The verification forward's RoPE positions (`verification_positions`); None for a chain, whose
        positions follow one another as in any forward."""
        return None if self.is_chain else verification_positions(self.parents, root_position)

    def along(self, nodes) -> "Draft":
        """The chain of these nodes' tokens with their q and display rows (a tree's path, as figures show it)."""
        nodes = list(nodes)
        shown = None if self.display_logits is None else self.display_logits[nodes]
        return Draft.chain([self.tokens[i] for i in nodes], self.q[nodes], shown)


NO_DRAFT = Draft([], [], np.zeros((0, 0)))      # a round that drafts nothing: a plain decode step


@dataclass(frozen=True)
class DraftParams:
    """What a round asks of its proposer."""
    num_speculative_tokens: int           # γ, >= 1: at most this many tokens (a chain's length)
    temperature: float                    # q is shaped like the target's p: the same temperature and top-p
    top_p: float = 1.0
    draft_confidence_threshold: float = 0.0   # a neural drafter stops at the first token it gives less than
    #                                           this probability; 0: never (a chain's rule: a tree ignores it)
    eagle_topk: int = 1                   # a token tree's children per expanded node (1: a chain of length γ)
    num_draft_tokens: int = 0             # a token tree's nodes at most (its depth is γ); 0: γ

    @classmethod
    def of(cls, settings, k: int, num_draft_tokens: int) -> "DraftParams":
        """A round's parameters from the generation's settings (engine/serving/settings.py): γ = k, the tree's
        budget `num_draft_tokens`, what room is left may have cut both."""
        return cls(k, settings.temperature, settings.top_p, settings.draft_confidence_threshold,
                   settings.speculative_eagle_topk, num_draft_tokens)

    def stops_at(self, logits, token: int, q) -> bool:  # the drafter's logits [V'], its q [V] (None: greedy)
        """Whether a neural drafter's draft ends at `token`: its own probability of it is below the threshold."""
        threshold = self.draft_confidence_threshold
        return bool(threshold) and draft_confidence(logits, token, q) < threshold


class Proposer(ABC):
    """Where a round's draft comes from (vLLM's ProposerInterface): the draft model, n-gram lookup, the heads.

    NOTE (the contract the session relies on):
    - `propose(tokens, params, rng)` is a generator. It yields each forward it needs as a ForwardRequest
      (engine/kv/runner.py) and is sent that forward's logits back: a scheduler may batch the requests of many
      sessions into one computation (engine/serving/scheduler.py). It returns the Draft, so a caller writes
      `draft = yield from proposer.propose(...)`. A proposer that needs no forward is a generator all the
      same, one that yields nothing. An empty draft means nothing to propose: the round is a plain step.
    - `tokens` is the session's context, prompt and output. A proposer that keeps a KV cache (`runner`) holds
      K/V for a prefix of it; after verification, `rollback(num_valid)` says how many tokens of the context
      survived (the context before the round and the accepted drafts), so that it can drop the rest.
    - `free()` releases what it holds; the session calls it when it ends or changes method.
    - Sampling with `rng` (temperature > 0) is the only randomness: a seed reproduces a run computed by the same
      products (a prefix-cache hit computes fewer rows, whose floats may differ in the last bits: docs/protocol.md).
    """
    method: str = ""                      # vLLM's name for it: the value of the `method` setting
    runner = None                         # the runner of its own KV cache (engine/kv/runner.py), if it keeps
    #                                       one: the page draws that pool, the metrics count its bytes

    @abstractmethod
    def propose(self, tokens: list[int], params: DraftParams,
                rng: np.random.Generator) -> Generator[ForwardRequest, np.ndarray, Draft]:
        """At most params.num_speculative_tokens tokens to follow `tokens`."""

    def rollback(self, num_valid: int) -> None:
        """The first `num_valid` tokens of the context are final: forget what followed them (a proposer that
        keeps nothing between rounds has nothing to forget)."""

    def free(self) -> None:
        if self.runner is not None:
            self.runner.free()
