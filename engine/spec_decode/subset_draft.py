"""A draft model whose LM head holds a frequent-token subset S of the vocabulary, plus the context's tokens.

A small draft's decode step on a CPU is mostly its LM head when the vocabulary is large (SmolLM2's 49,152 rows
against a 4 x 256 decoder), so its head keeps only the columns of S, the training answers' most frequent tokens
(FR-Spec, as the EAGLE head's, engine/spec_decode/heads.py), and adds the rows of the tokens the session's context
holds outside S (`ContextVocabulary`): a rare name of the prompt can still be drafted. q is zero outside those;
verification (engine/spec_decode/verify.py) stays exact, the residual max(0, p - q) covers every other token.

The model's forward gives logits over S; `engine.model.shipped_drafts.restrict_lm_head` says which tokens they are
(`lm_head_ids`) and keeps what the other rows need (`lm_head_embed`, `lm_head_norm`).
"""
from __future__ import annotations

from types import SimpleNamespace

from .heads import ContextVocabulary, LMRows, draft_from
from .proposers import DraftModelProposer


class SubsetDraftModelProposer(DraftModelProposer):
    """DraftModelProposer over S plus the context's tokens (see the module docstring)."""

    def __init__(self, runner):
        super().__init__(runner)
        m = runner.model
        rows = LMRows({"head": m.lm_head_embed, "norm": m.lm_head_norm})     # [n, C] by token id, g sqrt(C) folded in
        self.vocab = ContextVocabulary(SimpleNamespace(subset=m.lm_head_ids, lm_rows=rows))

    def context(self, tokens) -> None:
        self.vocab.update(tokens)

    def draft_token(self, logits, params, rng):  # logits [Vs] -> (token, q [V] or None, logits [Vs + n], shown [V])
        # the LM head's input is the last hidden state as the forward leaves it (x / |x|: lm_head_norm holds the rest)
        logits = self.vocab.logits(logits, self.runner.hidden[-1])
        x, q, shown = draft_from(logits, self.vocab.ids, self.vocab_size, params.temperature, params.top_p, rng)
        return x, q, logits, shown


def draft_model_proposer(runner) -> DraftModelProposer:
    """The proposer of a draft model's runner: over its LM head's subset if it has one, else the whole vocabulary."""
    if getattr(runner.model, "lm_head_ids", None) is not None:
        return SubsetDraftModelProposer(runner)
    return DraftModelProposer(runner)
