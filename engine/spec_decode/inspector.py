"""The token inspector's figures of a session's round: p(x), q(x) and the top-5 of p, q and the residual."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .sampling import log_normalisers, softmax, top_k_rows


class Unshown(NamedTuple):
    """A round's token events whose inspector figures are filled in after the round (outside engine time)."""
    events: list                # TokenResult, positions 1..n
    p_source: object            # [rows, V] the target's logits (p_is_logits) or its sampling distribution
    p_is_logits: bool
    q_source: object            # [drafts, V] the drafter's, likewise, or None
    q_is_logits: bool
    residual: object            # [V] the residual a resampled token was drawn from, or None


class Inspector:
    """The token inspector's figures of one session's token events, filled in after each round (`annotate`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.unshown: list[Unshown] = []

    def add(self, events, logits, verification, draft) -> None:
        """A verification's token events (positions 1..n), to annotate from the target's logits [n, V] or its
        sampling distributions (`verification.p`) and the draft's q, or its logits when greedy."""
        if verification.standard_num_accepted is not None:
            self._block_figures(events, verification)
        if verification.tree is not None:       # a token tree: the rows of its path, in the verdicts' positions
            logits, draft = logits[verification.tree.kept_rows], draft.along(verification.tree.shown_nodes)
        greedy = verification.p is None
        shows_logits = greedy and draft.display_logits is not None
        q_source = None if not draft else draft.display_logits if shows_logits else draft.q
        self.unshown.append(Unshown(events, logits if greedy else verification.p, greedy, q_source, shows_logits,
                                    verification.residual))

    @staticmethod
    def _block_figures(events, verification) -> None:
        """A block-verified round's draft tokens: h_i, which block verification compared r with, and what
        token-by-token verification would have done with the same draws: accept while r < min(1, p/q), reject at
        the first draw that fails, never try the drafts after it. (events: one per verdict, in order.)"""
        standard = verification.standard_num_accepted
        for e, v in zip(events, verification.verdicts):
            if v.stop_prob is not None:
                e.stop_prob = v.stop_prob
                e.standard_status = ("accepted" if e.position <= standard else
                                     "rejected" if e.position == standard + 1 else "unreached")

    def annotate(self) -> None:
        """Fill in what the token inspector shows: p(x), q(x) and the top-5 of p, q and the residual.

        Display, not decoding: it runs after the round's engine time is taken. p is softmax of the
        target's logits when greedy (the decision itself used point masses), else the sampling
        distribution; likewise q (softmax of the draft's logits when greedy).
        """
        for events, p_source, p_is_logits, q_source, q_is_logits, residual in self.unshown:
            n = max(e.position for e in events)                                    # rows shown
            p = p_source[:n]                                                       # [positions, V]
            q = None if q_source is None else q_source[:n]                         # [drafts, V]
            if p_is_logits and (q is None or q_is_logits):
                rows = p if q is None else np.concatenate([p, q])
                # Greedy: the figures are a few entries of softmax(logits) each, read off the logits with each
                # row's normaliser; the top-5 of p is the top-5 of the logits. A softmax of whole rows cost a
                # visible share of a speculative run's wall time with a large vocabulary.
                lse = log_normalisers(rows)
                tops = [[(x, math.exp(v - lse[r])) for x, v in top] for r, top in enumerate(top_k_rows(rows))]

                def prob(r, x, rows=rows, lse=lse):
                    return math.exp(float(rows[r, x]) - lse[r])
            else:
                parts = [softmax(p) if p_is_logits else p] + ([] if q is None else [softmax(q) if q_is_logits else q])
                rows = np.concatenate(parts) if len(parts) > 1 else parts[0]     # softmax only rows given as logits
                tops = top_k_rows(rows)

                def prob(r, x, rows=rows):
                    return float(rows[r, x])
            for e in events:
                i = e.position - 1
                e.p, e.top_p = prob(i, e.id), self._named(tops[i])
                if q is not None and i < len(q):
                    e.top_q = self._named(tops[len(p) + i])
                    if e.status != "bonus":
                        e.q = prob(len(p) + i, e.id)
                # greedy verification draws nothing: its "residual" is the point mass on the argmax, not shown
                if e.status == "resampled" and residual is not None and not p_is_logits:
                    e.residual_top = self._named(top_k_rows(residual[None])[0])
        self.unshown.clear()

    def _named(self, top) -> list:  # [(id, prob)] -> [[id, text, prob]]
        text = self.tokenizer.token_text
        return [[i, text(i), prob] for i, prob in top]
