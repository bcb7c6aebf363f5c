"""Speculative decoding: who proposes draft tokens, and how the target verifies them exactly.

Owns what a round's draft is and the contract every proposer keeps (`draft`), sampling from logits
(`sampling`), verification (greedy matching and Leviathan et al.'s rejection sampling; `verify`, with n-gram
prompt lookup; token trees and block verification: `tree_verify`), the proposers (draft model, n-gram;
`proposers`), the draft heads trained on the target (EAGLE, Medusa; `heads`), suffix decoding (its trees and
rule: `suffix`; the global trees an engine keeps: `suffix_caches`; the proposer: `suffix_proposer`), the γ
schedule (`schedule`), the seed article's teaching faults as hooks of a round (`faults`) and the inspector's
per-token annotations (p, q, min(1, p/q), r, the residual; `inspector`).

May import: engine.model, engine.kv.
"""
