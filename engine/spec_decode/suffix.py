"""Suffix decoding: drafts that need no model, from what was written before (Oliaro et al., arXiv 2411.04975;
Snowflake's ArcticInference, which vLLM's `method: "suffix"` runs).

Two kinds of tree count token strings, as in ArcticInference's `SuffixDecodingCache`:
- a per-request tree over the request's prompt and its output so far;
- a global tree over requests' outputs. Like ArcticInference's, it holds the current request's output too, so
  "earlier requests" below means "the global tree".

A speculation matches the context's latest tokens in a tree and follows the most frequent continuation:

    for match_len = 1 .. len(context) - 1 (the context cut to its last max_tree_depth tokens), while
    context[-match_len:] occurs in the tree:
        max_tokens = min(max_spec_tokens, int(max_spec_factor * match_len))
        prob = 1; from the match, step to the most frequent child c of each node n,
            prob *= count(c) / count(n),
        and keep c while prob >= min_token_prob, up to max_tokens tokens
        score = the sum of the kept tokens' probs
    keep the draft of the highest score (a tie goes to the longer match)

and the per-request tree's draft wins over the global tree's unless the global one scores higher. The
arithmetic is float32, as in ArcticInference, so that thresholds and ties fall the same way.

The structure is a suffix trie cut at `max_depth`: a node for every token string of length <= max_depth that
occurs in the sequences held, with `count` = how many times it occurs. ArcticInference keeps a path-compressed
suffix tree (O(n) nodes) with the same counts; the trie needs up to max_depth nodes per token, and is simple.
"""
from __future__ import annotations

import struct
from bisect import bisect_left, insort
from dataclasses import dataclass, field


SOURCE_REQUEST = "request"
SOURCE_EARLIER = "earlier_requests"


def _rank(node: _Node):
    """The order of siblings: most frequent first; among equals, by `stamp` (see `_Node`)."""
    return (-node.count, node.stamp)


class _Node:
    """One token string s: the tokens on the path from the root to this node.

    NOTE: `count` is the number of places s occurs in the sequences held (an occurrence that ends at a
    sequence's last token counts too), so count(child) / count(node) is how often s went on with the
    child's token. A child never counts more than its parent.

    Children are None, the only child, or a dict token -> child with `ranked`, the same children sorted by
    `_rank`. Among children of equal count the order is ArcticInference's linked list: a new child joins the
    end; a child whose count rises goes to the front of its new equal-count run if it led its old run, else
    to that run's end; a child whose count falls goes to the front of its new run. `stamp` encodes this: a
    child sent to the front gets -clock, one sent to the end +clock, with a clock that only goes up.
    """
    __slots__ = ("token", "count", "stamp", "children", "ranked")

    def __init__(self, token: int, stamp: int):
        self.token, self.stamp = token, stamp
        self.count = 1
        self.children = None
        self.ranked = None

    def child(self, token: int) -> _Node | None:
        kids = self.children
        if kids is None or type(kids) is _Node:
            return kids if kids is not None and kids.token == token else None
        return kids.get(token)

    def most_frequent_child(self) -> _Node | None:
        return self.ranked[0] if self.ranked is not None else self.children

    def ordered_children(self) -> list[_Node]:
        return list(self.ranked) if self.ranked is not None else [] if self.children is None else [self.children]

    def add_child(self, child: _Node) -> None:
        kids = self.children
        if kids is None:
            self.children = child
        elif type(kids) is _Node:
            self.children = {kids.token: kids, child.token: child}
            self.ranked = sorted(self.children.values(), key=_rank)
        else:
            kids[child.token] = child
            insort(self.ranked, child, key=_rank)

    def drop_child(self, child: _Node) -> None:
        if self.ranked is None:
            self.children = None
            return
        del self.ranked[bisect_left(self.ranked, _rank(child), key=_rank)]
        del self.children[child.token]
        if len(self.ranked) == 1:   # back to the lean form of a node with one child
            self.children, self.ranked = self.ranked[0], None

    def count_up(self, child: _Node, clock: int) -> None:
        """child.count += 1: to the front of its new run if it led its old run, else to that run's end."""
        if self.ranked is None:
            child.count, child.stamp = child.count + 1, -clock
            return
        i = bisect_left(self.ranked, _rank(child), key=_rank)
        led = i == 0 or self.ranked[i - 1].count != child.count
        self._replace(i, child, child.count + 1, -clock if led else clock)

    def count_down(self, child: _Node, clock: int) -> None:
        """child.count -= 1: to the front of its new run."""
        if self.ranked is None:
            child.count, child.stamp = child.count - 1, -clock
            return
        self._replace(bisect_left(self.ranked, _rank(child), key=_rank), child, child.count - 1, -clock)

    def _replace(self, i: int, child: _Node, count: int, stamp: int) -> None:
        del self.ranked[i]
        child.count, child.stamp = count, stamp
        insort(self.ranked, child, key=_rank)

    def subtree_size(self) -> int:
        size, stack = 0, [self]
        while stack:
            node = stack.pop()
            size += 1
            stack.extend(node.ordered_children())
        return size


@dataclass
class SuffixDraft:
    """A speculation. A chain now; `parents` already says where each token hangs, so that a tree of
    speculations (several frequent continuations) fits the same shape."""
    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)   # index of each token's parent; -1: follows the context
    probs: list[float] = field(default_factory=list)   # each token's frequency score (the prob above)
    score: float = 0.0                                  # sum(probs)
    match_len: int = 0                                  # how many of the context's latest tokens matched
    source: str = ""                                    # SOURCE_REQUEST | SOURCE_EARLIER


_FLOAT32 = struct.Struct("f")


def f32(x: float) -> float:
    """x rounded to float32. One float64 operation on float32 operands rounded once to float32 gives the
    float32 operation's result (+, *, / : float64 has more than twice float32's precision)."""
    return _FLOAT32.unpack(_FLOAT32.pack(x))[0]


def max_draft_tokens(match_len: int, max_spec_factor: float, max_spec_tokens: int) -> int:
    """min(max_spec_tokens, int(max_spec_factor * match_len)), with ArcticInference's float32 product and
    its 1e-6 guard against a product that falls just short of a whole number."""
    by_match = int(f32(match_len * f32(max_spec_factor)) + 1e-6)
    return max(0, min(max_spec_tokens, by_match))


class SuffixTree:
    """Every token string of length <= `max_depth` of the sequences held, with its count.

    Sequences are appended token by token (`append`, `extend`) and removed whole (`remove`). NOTE: after
    each call, for every such string s, find(s).count == its number of occurrences, and `num_nodes` is the
    number of distinct strings (the root, the empty string, not counted). Appending a token costs at most
    `max_depth` node updates: the token extends the sequence's latest max_depth - 1 suffixes and starts one.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node(token=-1, stamp=0)
        self.root.count = 0                              # counts every token held
        self.num_nodes = 0
        self._seqs: dict[int, list[int]] = {}          # seq_id -> its tokens
        self._ends: dict[int, list[_Node]] = {}         # seq_id -> nodes of its latest suffixes, shortest first
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def append(self, seq_id: int, token: int) -> None:
        token = int(token)
        self._seqs.setdefault(seq_id, []).append(token)
        ends = self._ends.get(seq_id, [])
        self.root.count += 1
        new_ends = []
        for parent in [self.root] + ends[: self.max_depth - 1]:
            child = parent.child(token)
            if child is None:
                child = _Node(token, stamp=self._tick())   # a new child joins the end
                parent.add_child(child)
                self.num_nodes += 1
            else:
                parent.count_up(child, self._tick())
            new_ends.append(child)
        self._ends[seq_id] = new_ends

    def extend(self, seq_id: int, tokens) -> None:
        for token in tokens:
            self.append(seq_id, token)

    def remove(self, seq_id: int) -> None:
        """Forget a sequence: every one of its suffixes is walked down and uncounted; a node no longer
        counted by anything goes, with its subtree (which only this sequence reached)."""
        seq = self._seqs.pop(seq_id)
        del self._ends[seq_id]
        for start in range(len(seq)):
            self.root.count -= 1
            node = self.root
            for token in seq[start:start + self.max_depth]:
                child = node.child(token)
                if child.count == 1:
                    node.drop_child(child)
                    self.num_nodes -= child.subtree_size()
                    break
                node.count_down(child, self._tick())
                node = child

    @property
    def seq_ids(self):
        return self._seqs.keys()

    def find(self, tokens) -> _Node | None:
        """The node of a token string, or None when the string does not occur (or is longer than max_depth)."""
        node = self.root
        for token in tokens:
            node = node.child(int(token))
            if node is None:
                return None
        return node

    def count(self, tokens) -> int:
        node = self.find(tokens)
        return 0 if node is None else node.count

    def continuations(self, tokens) -> dict[int, int]:
        """token -> how often `tokens` went on with it, most frequent first."""
        node = self.find(tokens)
        return {} if node is None else {c.token: c.count for c in node.ordered_children()}

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> SuffixDraft:
        """The best-scoring draft over every match length (the rule in the module docstring)."""
        context = [int(t) for t in context]
        best = SuffixDraft()
        for match_len in range(1, len(context)):
            node = self.find(context[-match_len:])
            if node is None:      # a longer string cannot occur where its suffix does not
                break
            draft = self._follow(node, max_draft_tokens(match_len, max_spec_factor, max_spec_tokens),
                                 f32(min_token_prob))
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best

    @staticmethod
    def _follow(node: _Node, max_tokens: int, min_token_prob: float) -> SuffixDraft:
        """The chain of most frequent children below `node`, while the product of count ratios holds."""
        draft = SuffixDraft()
        prob, score = 1.0, 0.0
        while len(draft.token_ids) < max_tokens:
            child = node.most_frequent_child()
            if child is None:
                break
            if child.count != node.count:       # a ratio of 1 leaves prob as it is
                prob = f32(prob * f32(child.count / node.count))
                if prob < min_token_prob:
                    break
            draft.parents.append(len(draft.token_ids) - 1)
            draft.token_ids.append(child.token)
            draft.probs.append(prob)
            score = f32(score + prob)
            node = child
        draft.score = score
        return draft


class SuffixDecodingCache:
    """A per-request tree for each active request, and one global tree over requests' outputs.

    NOTE: the global tree holds the outputs of at most `max_cached_requests` requests (0: no global tree),
    the oldest evicted first, and at most `max_tree_nodes` nodes after every call: past that, whole outputs
    are evicted oldest first, the current request's own included when nothing else is left. vLLM and
    ArcticInference have no node bound; below it, this cache drafts as they do. `global_tree_nodes` is the
    global tree's size for /metrics. A request's own tree holds up to max_tree_depth nodes per token of its
    prompt and output, and goes when the request stops. Not thread-safe: call it from one thread.
    """

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_tree_nodes: int = 1_000_000):
        check_range("suffix_decoding_max_tree_depth", max_tree_depth, 1, 64)
        check_range("suffix_decoding_max_cached_requests", max_cached_requests, 0, 1_000_000)
        check_range("suffix_decoding_max_tree_nodes", max_tree_nodes, 1, 100_000_000)
        self.max_tree_depth, self.max_cached_requests = max_tree_depth, max_cached_requests
        self.max_tree_nodes = max_tree_nodes
        self.global_tree = SuffixTree(max_tree_depth)
        self._local_trees: dict[object, SuffixTree] = {}
        self._seq_of: dict[object, int] = {}    # req_id -> its seq_id in the global tree; oldest first
        self._next_seq_id = 0

    @property
    def active_requests(self):
        return self._local_trees.keys()

    @property
    def cached_requests(self):
        return self._seq_of.keys()

    @property
    def global_tree_nodes(self) -> int:
        return self.global_tree.num_nodes

    def start_request(self, req_id, prompt_token_ids) -> None:
        if req_id in self._local_trees:
            raise ValueError(f"request {req_id!r} is already active")
        tree = SuffixTree(self.max_tree_depth)
        tree.extend(0, prompt_token_ids)
        self._local_trees[req_id] = tree
        if self.max_cached_requests == 0:
            return
        if req_id in self._seq_of:
            self.evict_cached_response(req_id)
        self._seq_of[req_id] = self._next_seq_id
        self._next_seq_id += 1
        while len(self._seq_of) > self.max_cached_requests:
            self.evict_cached_response(next(iter(self._seq_of)))   # never the new one: it is the newest

    def add_active_response(self, req_id, token_ids) -> None:
        """Append verified output tokens of an active request to its tree and to the global tree."""
        if req_id not in self._local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        self._local_trees[req_id].extend(0, token_ids)
        if req_id in self._seq_of:
            self.global_tree.extend(self._seq_of[req_id], token_ids)
            while self.global_tree.num_nodes > self.max_tree_nodes:
                self.evict_cached_response(next(iter(self._seq_of)))

    def stop_request(self, req_id) -> None:
        """The request is done: its tree goes; its output stays in the global tree until evicted."""
        if req_id not in self._local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        del self._local_trees[req_id]

    def evict_cached_response(self, req_id) -> None:
        if req_id not in self._seq_of:
            raise ValueError(f"request {req_id!r} is not cached")
        seq_id = self._seq_of.pop(req_id)
        if seq_id in self.global_tree.seq_ids:    # a request with no output token yet holds nothing there
            self.global_tree.remove(seq_id)

    def speculate(self, req_id, context, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  min_token_prob: float = 0.1) -> SuffixDraft:
        """The better of the request's own tree's draft and the global tree's (the request's own on a tie)."""
        if req_id not in self._local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        context = context[-self.max_tree_depth:]   # a longer match could not be followed by anything
        own = self._local_trees[req_id].speculate(context, max_spec_tokens, max_spec_factor, min_token_prob)
        earlier = self.global_tree.speculate(context, max_spec_tokens, max_spec_factor, min_token_prob)
        own.source, earlier.source = SOURCE_REQUEST, SOURCE_EARLIER
        return own if own.score >= earlier.score else earlier


def check_range(name: str, value, low, high) -> None:
    """Bad input names the setting and its range."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
