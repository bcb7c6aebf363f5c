"""Proposers: where draft tokens come from. One interface, `propose(tokens, k) -> (tokens, q)`, written
as a generator that yields the forwards it needs (engine.runner.ForwardRequest) and returns its result.

q is [k, V]: the draft distribution each token was drawn from (a point mass for n-gram lookup and at
temperature 0). `rollback(num_valid)` tells the proposer how many tokens of its context survived verification.
A neural drafter given `min_confidence` > 0 proposes fewer than k tokens when its probability of a draft
(sampling.draft_confidence) falls below it: the length of each round's draft is then the drafter's own call,
made before the target sees it, so verification stays exact.
"""
from __future__ import annotations

import numpy as np

from ..kv.runner import ForwardRequest, PagedRunner, RecomputeRunner
from .sampling import draft_confidence, probs_from_logits, sample
from .verify import ngram_propose


def point_masses(tokens, vocab_size: int):  # [k] -> [k, V]
    q = np.zeros((len(tokens), vocab_size))
    q[np.arange(len(tokens)), tokens] = 1.0
    return q


class NgramProposer:
    method = "ngram"

    def __init__(self, vocab_size: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.vocab_size, self.min_n, self.max_n = vocab_size, prompt_lookup_min, prompt_lookup_max
        self.forward_calls, self.forward_s, self.logits = 0, 0.0, None

    def propose(self, tokens, k, temperature, top_p, rng, min_confidence: float = 0.0):  # -> (drafts, q)
        drafts = ngram_propose(tokens, k, self.min_n, self.max_n)
        return drafts.tolist(), point_masses(drafts, self.vocab_size)
        yield  # a generator like DraftModelProposer.propose, which yields forward requests

    def rollback(self, num_valid: int) -> None:
        pass

    def free(self) -> None:
        pass


class DraftModelProposer:
    """A small model proposes k tokens autoregressively; its own paged cache is rolled back after
    verification. NOTE: the runner always holds a prefix of the session's tokens."""
    method = "draft_model"

    def __init__(self, runner: PagedRunner | RecomputeRunner):
        self.runner = runner
        self.display_q = None     # [k, V] temperature-1 distributions, for the inspector when greedy

    @property
    def forward_calls(self) -> int:
        return self.runner.forward_calls

    @property
    def forward_s(self) -> float:
        return self.runner.forward_s

    def propose(self, tokens, k, temperature, top_p, rng, min_confidence: float = 0.0):  # generator -> (drafts, q)
        runner = self.runner
        catch_up = ForwardRequest(runner, tokens[runner.num_tokens:], last_only=True, role="draft")
        logits = (yield catch_up)[-1]
        drafts, qs, raw = [], [], []
        for i in range(k):
            if temperature == 0:    # greedy: the argmax; q is its point mass, built once below
                x = int(np.argmax(logits))
            else:
                qs.append(probs_from_logits(logits, temperature, top_p))
                x = sample(qs[-1], rng)
            drafts.append(x)
            raw.append(logits)
            if i == k - 1 or (min_confidence and draft_confidence(logits, x, qs[-1] if qs else None) < min_confidence):
                break
            logits = (yield ForwardRequest(runner, [x], last_only=True))[-1]
        self.display_q = np.array(raw)
        return drafts, np.array(qs) if qs else point_masses(drafts, len(logits))

    def rollback(self, num_valid: int) -> None:
        """Keep the first `num_valid` tokens held (context before the round + accepted drafts)."""
        self.runner.truncate(min(self.runner.num_tokens, num_valid))
        self.runner.commit()

    def free(self) -> None:
        self.runner.free()
