"""The token inspector's figures of a session's round: p(x), q(x) and the top-5 of p, q and the residual."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .sampling import softmax, top_k_rows


class Unshown(NamedTuple):
    """A round's token events whose inspector figures are filled in after the round (outside engine time)."""
    events: list                # TokenResult, positions 1..n
    p_source: object            # [rows, V] the target's logits (p_is_logits) or its sampling distribution
    p_is_logits: bool
    q_source: object            # [drafts, V] the drafter's, likewise, or None
    q_is_logits: bool
    residual: object            # [V] the residual a resampled token was drawn from, or None


class InspectorAnnotations:
    """Mixed into GenerationSession (engine/session.py): fills in the token events of `_unshown` after a round."""

    def _annotate(self) -> None:
        """Fill in what the token inspector shows: p(x), q(x) and the top-5 of p, q and the residual.

        Display, not decoding: it runs after the round's engine time is taken. p is softmax of the
        target's logits when greedy (the decision itself used point masses), else the sampling
        distribution; likewise q (softmax of the draft's logits when greedy).
        """
        for events, p_source, p_is_logits, q_source, q_is_logits, residual in self._unshown:
            n = max(e.position for e in events)                                    # rows shown
            p = p_source[:n]                                                       # [positions, V]
            q = None if q_source is None else q_source[:n]                         # [drafts, V]
            if q is not None and p_is_logits and q_is_logits:   # one softmax and one top-5 for both: per-call
                both = softmax(np.concatenate([p, q]))           # overhead is most of this work
                p, q = both[:len(p)], both[len(p):]
            else:
                p = softmax(p) if p_is_logits else p
                q = softmax(q) if q is not None and q_is_logits else q
            tops = self._top_rows(p if q is None else np.concatenate([p, q]))
            for e in events:
                i = e.position - 1
                e.p, e.top_p = float(p[i, e.id]), tops[i]
                if q is not None and i < len(q):
                    e.top_q = tops[len(p) + i]
                    if e.status != "bonus":
                        e.q = float(q[i, e.id])
                if e.status == "resampled" and residual is not None:
                    e.residual_top = self._top_rows(residual[None])[0]
        self._unshown.clear()

    def _top_rows(self, p) -> list:  # [n, V] -> per row [[id, text, prob]] x 5
        text = self.tokenizer.token_text
        return [[[i, text(i), prob] for i, prob in row] for row in top_k_rows(p)]

