"""Proposers without a head: n-gram prompt lookup and a small draft model, behind the Proposer contract of
engine/spec_decode/draft.py (the heads trained on the target: engine/spec_decode/heads.py).

q is the draft distribution each token was drawn from: a point mass for n-gram lookup and at temperature 0.
A neural drafter given a `draft_confidence_threshold` proposes fewer than k tokens when its probability of a
draft (sampling.draft_confidence) falls below it: the length of each round's draft is then the drafter's own
call, made before the target sees it, so verification stays exact.
"""
from __future__ import annotations

import numpy as np

from ..kv.runner import ForwardRequest, PagedRunner, RecomputeRunner
from .draft import Draft, DraftParams, Proposer
from .ngram import ngram_propose, ngram_tree
from .sampling import probs_from_logits, sample


def point_masses(tokens, vocab_size: int):  # [k] -> [k, V]
    q = np.zeros((len(tokens), vocab_size))
    q[np.arange(len(tokens)), tokens] = 1.0
    return q


class NgramProposer(Proposer):
    """vLLM's `ngram`: the tokens that followed an earlier occurrence of the context's last n-gram."""
    method = "ngram"

    def __init__(self, vocab_size: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.vocab_size, self.min_n, self.max_n = vocab_size, prompt_lookup_min, prompt_lookup_max

    def propose(self, tokens, params: DraftParams, rng):
        """The continuation of the earliest match (a chain); with eagle_topk > 1 a tree of several matches'
        continuations (engine/spec_decode/ngram.py)."""
        yield from ()                                   # no forward (still a generator: the Proposer contract)
        if params.eagle_topk > 1:
            drafts, parents = ngram_tree(tokens, params.num_speculative_tokens, params.eagle_topk,
                                         params.num_draft_tokens or params.num_speculative_tokens, self.min_n,
                                         self.max_n)
            return Draft(drafts, parents, point_masses(drafts, self.vocab_size))
        drafts = ngram_propose(tokens, params.num_speculative_tokens, self.min_n, self.max_n)
        return Draft.chain(drafts.tolist(), point_masses(drafts, self.vocab_size))


class DraftModelProposer(Proposer):
    """A small model proposes k tokens autoregressively; its own paged cache is rolled back after
    verification. NOTE: the runner always holds a prefix of the session's tokens."""
    method = "draft_model"

    def __init__(self, runner: PagedRunner | RecomputeRunner):
        self.runner = runner

    def propose(self, tokens, params: DraftParams, rng):
        runner, calls = self.runner, self.runner.forward_calls
        catch_up = ForwardRequest(runner, tokens[runner.num_tokens:], last_only=True, role="draft")
        logits = (yield catch_up)[-1]
        drafts, qs, raw = [], [], []
        self.context(tokens)
        for i in range(params.num_speculative_tokens):
            x, q, logits, shown = self.draft_token(logits, params, rng)
            drafts.append(x)
            raw.append(shown)
            if q is not None:
                qs.append(q)
            if i == params.num_speculative_tokens - 1 or params.stops_at(logits, x, q):
                break
            logits = (yield ForwardRequest(runner, [x], last_only=True))[-1]
        q = np.array(qs) if qs else point_masses(drafts, self.vocab_size)
        return Draft.chain(drafts, q, np.array(raw), runner.forward_calls - calls)   # a chunked catch-up's chunks count

    @property
    def vocab_size(self) -> int:
        return self.runner.model.cfg.vocab_size

    def context(self, tokens) -> None:
        """The session's tokens before a round's drafting (a drafter whose vocabulary follows the context reads them)."""

    def draft_token(self, logits, params: DraftParams, rng):  # logits [V] -> (token, q [V] or None, logits, shown [V])
        """One draft token from the draft model's logits: the argmax when greedy (q is its point mass, built once
        per round), else a sample from q; the logits its confidence is read from, and the logits shown as q."""
        if params.temperature == 0:
            return int(np.argmax(logits)), None, logits, logits
        q = probs_from_logits(logits, params.temperature, params.top_p)
        return sample(q, rng), q, logits, logits

    def rollback(self, num_valid: int) -> None:
        """Keep the first `num_valid` tokens held (context before the round + accepted drafts)."""
        self.runner.truncate(min(self.runner.num_tokens, num_valid))
        self.runner.commit()
