"""vLLM's `method: "suffix"`: drafts matched in suffix trees of what was written before, no model needed (the trees
and the rule: engine/spec_decode/suffix.py; where the global trees live: engine/spec_decode/suffix_caches.py).

Each round, as vLLM's SuffixDecodingProposer does for a request: the tokens verified since the last round go into
the request's own tree and its model's global tree, then the context's latest tokens are matched in both and the
better-scoring chain is the draft, at most num_speculative_tokens long (and at most
suffix_decoding_max_spec_factor times the match, while the path probability stays at or above
suffix_decoding_min_token_prob). The draft is deterministic, so q is a point mass on each token and
verification stays exact at any temperature (a token is accepted with probability p(x)).
"""
from __future__ import annotations

from dataclasses import dataclass

from .draft import Draft, DraftParams, Proposer
from .proposers import point_masses
from .suffix_caches import SuffixCaches, TreeShape


@dataclass(frozen=True)
class SuffixParams:
    """The suffix settings of a generation (vLLM's names, engine/serving/settings.py)."""
    max_tree_depth: int                          # suffix_decoding_max_tree_depth
    max_cached_requests: int                     # suffix_decoding_max_cached_requests
    max_spec_factor: float                       # suffix_decoding_max_spec_factor
    min_token_prob: float                        # suffix_decoding_min_token_prob

    @classmethod
    def of(cls, settings) -> "SuffixParams":
        return cls(settings.suffix_decoding_max_tree_depth, settings.suffix_decoding_max_cached_requests,
                   settings.suffix_decoding_max_spec_factor, settings.suffix_decoding_min_token_prob)

    @property
    def shape(self) -> TreeShape:
        return TreeShape(self.max_tree_depth, self.max_cached_requests)


class SuffixProposer(Proposer):
    """Suffix decoding for one generation.

    NOTE: `tokens` is the session's context list, which grows in place by verified tokens only (prompt, then
    output); the proposer remembers how much of it its trees hold (`_seen`). Made when the generation starts
    (before its first token), its own tree starts over the prompt and every output token reaches the global tree;
    made mid-run (the method changed), its own tree starts over the context so far and only later tokens reach
    the global tree. `free` adds the tokens verified after the last round and stops the request: its output stays
    cached for later requests."""
    method = "suffix"

    def __init__(self, caches: SuffixCaches, model: str, params: SuffixParams, tokens: list[int], vocab_size: int,
                 scope_id=None):
        self.params, self.vocab_size, self._tokens = params, vocab_size, tokens
        self._seen = len(tokens)
        self.request = caches.start(model, params.shape, list(tokens), scope_id)

    def _catch_up(self, tokens: list[int]) -> None:
        self.request.add(tokens[self._seen:])
        self._seen = len(tokens)

    def propose(self, tokens, params: DraftParams, rng):
        yield from ()                                   # no forward (still a generator: the Proposer contract)
        self._catch_up(tokens)
        p = self.params
        found = self.request.speculate(tokens, params.num_speculative_tokens, p.max_spec_factor, p.min_token_prob)
        origin = {"source": found.source, "match_len": found.match_len, "score": found.score, "probs": found.probs}
        return Draft.chain(found.token_ids, point_masses(found.token_ids, self.vocab_size), origin=origin)

    def free(self) -> None:
        if self.request.active:
            self._catch_up(self._tokens)
            self.request.stop()
