"""n-gram lookup (prompt lookup): drafts taken from the context itself, a chain or a tree.

vLLM's `ngram` rule (`ngram_propose`) drafts what followed the earliest earlier occurrence of the context's
longest matching suffix n-gram. Where that n-gram occurred several times, the occurrences may have gone on
differently; a tree (`ngram_tree`) drafts them all at once. The continuations of the suffix's earlier occurrences (the first
MAX_MATCHES, up to the tree's depth each) are merged where they agree, a trie whose node counts the occurrences
that pass through it. Each node keeps its `topk` children seen most often (ties: the one seen first), and the
tree the `num_draft_tokens` nodes seen most often (a child is never seen more often than its parent, so they
form a tree). Siblings are listed most frequent first, the order verification tries them in.

Nothing here is random: each node's q is the point mass on its token, and the verification of a tree
(engine/spec_decode/tree_verify.py) is exact with it, as for EAGLE-2's trees (engine/spec_decode/eagle_tree.py).
"""
from __future__ import annotations

import numpy as np

MAX_MATCHES = 64          # earlier occurrences read: a repetitive context has hundreds, and the first few decide


def suffix_matches(context, min_n: int, max_n: int, limit: int = MAX_MATCHES) -> list[int]:
    """Where the continuations of the longest suffix n-gram (max_n down to min_n) that occurred earlier start, the
    earliest occurrence first (at most `limit`). Empty when nothing matches."""
    # One character per token id (str holds any id below 0x110000), so that str.find, a C loop, finds the
    # occurrences: several times faster than comparing numpy windows of the context.
    ids = [int(t) for t in context]
    text, L = "".join(map(chr, ids)), len(ids)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix, starts = text[L - n:], []
        at = text.find(suffix, 0, L - 1)           # an occurrence that ends before the last token
        while at >= 0 and len(starts) < limit:
            starts.append(at + n)
            at = text.find(suffix, at + 1, L - 1)
        if starts:
            return starts
    return []


def ngram_propose(context, k: int, min_n: int, max_n: int) -> np.ndarray:
    """Prompt lookup, vLLM's `ngram` rule: find the longest suffix n-gram (max_n down to min_n) that also
    occurs earlier in the context, and propose the (up to) k tokens that followed its earliest earlier
    occurrence (vLLM's `_find_longest_matched_ngram_and_propose_tokens`; tests/e2e/vllm_live check it live).
    Returns an empty array when nothing matches.
    """
    starts = suffix_matches(context, min_n, max_n, limit=1)
    if not starts:
        return np.zeros(0, dtype=np.int64)
    return np.array([int(t) for t in context[starts[0]:starts[0] + k]], dtype=np.int64)


def ngram_tree(context, depth: int, topk: int, budget: int, min_n: int, max_n: int) -> tuple[list[int], list[int]]:
    """The tree's tokens and parents (topological order, siblings most frequent first); empty without a match."""
    ids = [int(t) for t in context]
    key_of, tokens, parents, depths, count = {}, [], [], [], []    # the trie: node ids in the order first seen
    for start in suffix_matches(ids, min_n, max_n):
        node = -1
        for token in ids[start:start + depth]:
            child = key_of.get((node, token))
            if child is None:
                child = key_of[(node, token)] = len(tokens)
                tokens.append(token)
                parents.append(node)
                depths.append(1 if node < 0 else depths[node] + 1)
                count.append(0)
            count[child] += 1
            node = child
    rank, seen = {}, {}                            # a node's place among its siblings, most frequent first
    for i in sorted(range(len(tokens)), key=lambda i: (-count[i], i)):
        rank[i] = seen[parents[i]] = seen.get(parents[i], -1) + 1
    kept = set()
    for i in sorted(range(len(tokens)), key=lambda i: (-count[i], depths[i], i)):   # a parent before its children
        if len(kept) == budget:
            break
        if rank[i] < topk and (parents[i] < 0 or parents[i] in kept):
            kept.add(i)
    nodes = sorted(kept, key=lambda i: (depths[i], -count[i], i))
    index = {node: n for n, node in enumerate(nodes)}
    return [tokens[i] for i in nodes], [index.get(parents[i], -1) for i in nodes]
