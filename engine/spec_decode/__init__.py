"""Speculative decoding: who proposes draft tokens, and how the target verifies them exactly.

Owns sampling from logits (`sampling`), verification (greedy matching and Leviathan et al.'s rejection
sampling; `verify`, with n-gram prompt lookup), the proposers (draft model, n-gram; `proposers`), the draft
heads trained on the target (EAGLE, Medusa; `heads`) and the inspector's per-token annotations (p, q,
min(1, p/q), r, the residual; `inspector`).

May import: engine.model, engine.kv.
"""
