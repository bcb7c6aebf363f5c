"""Suffix decoding's trees against a brute-force reference: occurrence counts by scanning the sequences, the
order of equal-count siblings by ArcticInference's linked-list rules written out branch by branch, and the
speculation rule recomputed from both in numpy float32. Then hand-checked chains, eviction and the node bound."""
import random
from collections import Counter

import numpy as np
import pytest

from engine.spec_decode.suffix import SOURCE_EARLIER, SOURCE_REQUEST, SuffixDecodingCache, SuffixTree


def brute_counts(seqs, max_depth):  # every substring of length 1..max_depth -> its number of occurrences
    counts = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for n in range(1, min(max_depth, len(seq) - i) + 1):
                counts[tuple(seq[i:i + n])] += 1
    return counts


def dump(tree, prefix=()):  # {token string: count}, walked through the public API only
    out = {}
    for token, count in tree.continuations(prefix).items():
        out[prefix + (token,)] = count
        out.update(dump(tree, prefix + (token,)))
    return out


class LinkedListModel:
    """ArcticInference's sibling lists: one Python list of child tokens per string, moved by the branches of
    its C++ `_increment_count` / `_decrement_count` as written there, with the counts that drive them."""

    def __init__(self, max_depth):
        self.max_depth, self.seqs, self.count, self.children = max_depth, {}, Counter(), {(): []}

    def append(self, seq_id, token):
        seq = self.seqs.setdefault(seq_id, [])
        seq.append(token)
        for start in range(max(0, len(seq) - self.max_depth), len(seq)):
            s = tuple(seq[start:])
            if self.count[s] == 0:
                self.children[s[:-1]].append(token)       # a new child: at the end of the list
                self.children[s] = []
            else:
                self._increment(s[:-1], token)
            self.count[s] += 1

    def remove(self, seq_id):
        seq = self.seqs.pop(seq_id)
        for start in range(len(seq)):
            for n in range(1, min(self.max_depth, len(seq) - start) + 1):
                s = tuple(seq[start:start + n])
                if self.count[s] == 1:                      # goes, with everything below it
                    self.children[s[:-1]].remove(s[-1])
                    for t in [t for t in self.count if t[:n] == s]:
                        del self.count[t], self.children[t]
                    break
                self._decrement(s[:-1], s[-1])
                self.count[s] -= 1

    def _count_of(self, parent, token):
        return self.count[parent + (token,)]

    def _increment(self, parent, token):  # before the count goes from c to c + 1
        kids = self.children[parent]
        i, c = kids.index(token), self._count_of(parent, token)
        prev = self._count_of(parent, kids[i - 1]) if i > 0 else None
        if prev is None or prev > c + 1:
            return
        run = c + 1 if prev == c + 1 else c   # before the head of the (c+1) group, or of its own c group
        kids.pop(i)
        kids.insert(next(j for j, t in enumerate(kids) if self._count_of(parent, t) == run), token)

    def _decrement(self, parent, token):  # before the count goes from c to c - 1
        kids = self.children[parent]
        i, c = kids.index(token), self._count_of(parent, token)
        nxt = self._count_of(parent, kids[i + 1]) if i + 1 < len(kids) else None
        if nxt is None or nxt < c:
            return
        kids.pop(i)                           # after the last sibling still counting c
        kids.insert(max(j for j, t in enumerate(kids) if self._count_of(parent, t) == c) + 1, token)


def reference_speculate(model, context, max_spec_tokens, max_spec_factor, min_token_prob):
    """The rule as ArcticInference's SuffixTree::speculate states it, in numpy float32."""
    best_tokens, best_probs, best_score, best_len = [], [], np.float32(0), 0
    for match_len in range(1, len(context)):
        node = tuple(context[-match_len:])
        if model.count[node] == 0:
            break
        by_match = int(float(np.float32(match_len) * np.float32(max_spec_factor)) + 1e-6)
        max_tokens = max(0, min(max_spec_tokens, by_match))
        tokens, probs, prob, score = [], [], np.float32(1), np.float32(0)
        while len(tokens) < max_tokens and model.children[node]:
            child = node + (model.children[node][0],)
            prob = prob * (np.float32(model.count[child]) / np.float32(model.count[node]))
            if prob < np.float32(min_token_prob):
                break
            tokens.append(child[-1])
            probs.append(float(prob))
            score = score + prob
            node = child
        if score >= best_score:
            best_tokens, best_probs, best_score, best_len = tokens, probs, score, match_len
    return best_tokens, best_probs, float(best_score), best_len


@pytest.mark.parametrize("seed", range(6))
def test_counts_sibling_order_matches_and_drafts_equal_the_reference(seed):
    rng = random.Random(seed)
    max_depth, vocab = rng.choice([1, 2, 4, 7]), rng.choice([2, 3, 5])
    tree, model, next_id = SuffixTree(max_depth), LinkedListModel(max_depth), 0
    for step in range(1, 601):
        held = [s for s in model.seqs if model.seqs[s]]
        if rng.random() < 0.04 and len(held) > 1:
            victim = rng.choice(held)
            tree.remove(victim)
            model.remove(victim)
        else:
            if not model.seqs or (len(model.seqs) < 4 and rng.random() < 0.05):
                model.seqs[next_id], next_id = [], next_id + 1
            seq_id = rng.choice(list(model.seqs))
            token = rng.choice([0, 0, 1] + list(range(vocab)))     # skewed: many repeats, many ties
            tree.append(seq_id, token)
            model.append(seq_id, token)
        if step % 100:
            continue
        brute = brute_counts(model.seqs.values(), max_depth)
        assert dump(tree) == dict(brute) == {s: c for s, c in model.count.items() if c}
        assert tree.num_nodes == len(brute)
        for s, kids in model.children.items():
            assert list(tree.continuations(s)) == kids, s
        for _ in range(40):
            held = [q for q in model.seqs.values() if q]
            source = rng.choice(held)
            end = rng.randrange(len(source))
            context = source[max(0, end - rng.randrange(1, 10)):end + 1]
            if rng.random() < 0.3:
                context = [rng.randrange(vocab + 1) for _ in range(rng.randrange(1, 10))]
            matched = [n for n in range(1, len(context) + 1) if tree.find(context[-n:]) is not None]
            assert matched == [n for n in range(1, len(context) + 1) if brute[tuple(context[-n:])]]
            assert matched == list(range(1, len(matched) + 1))   # the longest match, and every shorter one
            settings = (rng.randrange(0, 9), rng.choice([0.5, 1.0, 1.5, 3.0]), rng.choice([0.0, 0.1, 0.25, 1 / 3]))
            draft = tree.speculate(context, *settings)
            assert (draft.token_ids, draft.probs, draft.score, draft.match_len) == \
                reference_speculate(model, context, *settings)
            assert draft.parents == list(range(-1, len(draft.token_ids) - 1))


def test_appending_token_by_token_equals_building_from_scratch():
    rng = random.Random(7)
    seqs = {i: [rng.randrange(4) for _ in range(rng.randrange(20, 60))] for i in range(3)}
    interleaved, whole = SuffixTree(5), SuffixTree(5)
    cursors = {i: 0 for i in seqs}
    while any(cursors[i] < len(seqs[i]) for i in seqs):
        i = rng.choice([i for i in seqs if cursors[i] < len(seqs[i])])
        interleaved.append(i, seqs[i][cursors[i]])
        cursors[i] += 1
    for i in reversed(seqs):
        whole.extend(i, seqs[i])
    assert dump(interleaved) == dump(whole) == dict(brute_counts(seqs.values(), 5))
    assert interleaved.num_nodes == whole.num_nodes


def test_removing_a_sequence_equals_never_having_added_it():
    rng = random.Random(3)
    seqs = [[rng.randrange(3) for _ in range(40)] for _ in range(3)]
    tree, without = SuffixTree(6), SuffixTree(6)
    for i, seq in enumerate(seqs):
        tree.extend(i, seq)
    tree.remove(1)
    without.extend(0, seqs[0])
    without.extend(2, seqs[2])
    assert dump(tree) == dump(without)
    assert tree.num_nodes == without.num_nodes
    for i in (0, 2):
        tree.remove(i)
    assert tree.num_nodes == 0 and dump(tree) == {}


def test_chain_follows_the_most_frequent_continuation_as_far_as_the_match():
    tree = SuffixTree(24)
    seq = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    tree.extend(0, seq)
    # "1 2" occurred 4 times: followed by 3 twice, by 4 once, by nothing once -> 3 with 2/4; "1 2 3" was
    # always followed by 1 -> still 0.5. A match of 2 tokens allows 2 tokens (max_spec_factor 1).
    draft = tree.speculate(seq, 8, 1.0, 0.1)
    assert (draft.token_ids, draft.probs, draft.score, draft.match_len) == ([3, 1], [0.5, 0.5], 1.0, 2)
    # one token allowed: "2" and "1 2" both draft [3] at 0.5; the tie goes to the longer match
    draft = tree.speculate(seq, 1, 1.0, 0.1)
    assert (draft.token_ids, draft.match_len) == ([3], 2)
    # nothing is likely enough: an empty draft, and the longest match (the context is in the tree itself)
    draft = tree.speculate(seq, 8, 1.0, 0.6)
    assert (draft.token_ids, draft.score, draft.match_len) == ([], 0.0, len(seq) - 1)


def test_token_probability_multiplies_along_the_path():
    tree = SuffixTree(24)
    tree.extend(0, [1, 2, 3, 1, 2, 4, 1, 5])
    # after "1": 2 with 2/3; after "1 2": 3 and 4 once each (3 came first) -> 2/3 * 1/2 = 1/3
    draft = tree.speculate([9, 1], 8, 2.0, 0.3)
    assert draft.token_ids == [2, 3] and draft.match_len == 1
    assert draft.probs == [float(np.float32(2 / 3)), float(np.float32(2 / 3) * np.float32(0.5))]
    assert tree.speculate([9, 1], 8, 2.0, 0.34).token_ids == [2]
    assert tree.speculate([9, 1], 8, 1.0, 0.3).token_ids == [2]       # a match of 1 allows 1 token


def test_draft_length_follows_the_match_times_max_spec_factor():
    tree = SuffixTree(24)
    tree.extend(0, [5, 6, 7, 8, 9, 0, 5, 6, 7, 8, 9])
    assert tree.speculate([1, 5, 6], 8, 1.0, 0.1).token_ids == [7, 8]              # match 2 -> 2 tokens
    assert tree.speculate([1, 5, 6], 8, 0.5, 0.1).token_ids == [7]                 # int(0.5 * 2)
    assert tree.speculate([1, 5, 6], 8, 2.0, 0.1).token_ids == [7, 8, 9, 0]        # then "9" ends once: 0.5
    assert tree.speculate([1, 5, 6], 3, 2.0, 0.1).token_ids == [7, 8, 9]           # num_speculative_tokens


def test_cache_drafts_from_earlier_requests_and_prefers_the_request_on_a_tie():
    cache = SuffixDecodingCache(max_tree_depth=8)
    prompt, answer = [1, 2, 3], [10, 11, 12, 13, 14, 15]
    cache.start_request("a", prompt)
    cache.add_active_response("a", answer)
    cache.stop_request("a")
    assert list(cache.active_requests) == [] and list(cache.cached_requests) == ["a"]
    cache.start_request("b", prompt)            # the same question again
    cache.add_active_response("b", answer[:3])
    draft = cache.speculate("b", prompt + answer[:3], 4)
    # the global tree holds a's answer and b's output so far: "10 11 12" occurred twice, once followed by 13
    assert draft.source == SOURCE_EARLIER and draft.token_ids == [13, 14, 15]
    assert draft.probs == [0.5, 0.5, 0.5] and draft.match_len == 3
    cache.start_request("c", [7, 8, 7, 8])
    cache.add_active_response("c", [7])
    draft = cache.speculate("c", [7, 8, 7, 8, 7], 4)       # only c's own prompt knows what follows 7
    assert draft.source == SOURCE_REQUEST and draft.token_ids == [8, 7]
    cache.start_request("x", [1, 2])
    cache.add_active_response("x", [5, 6, 7])
    cache.start_request("y", [5, 6, 7, 9])
    cache.add_active_response("y", [5])
    draft = cache.speculate("y", [5, 6, 7, 9, 5], 4)       # both trees: "5" twice, once followed by 6
    assert draft.source == SOURCE_REQUEST and (draft.token_ids, draft.probs) == ([6], [0.5])
    with pytest.raises(ValueError, match="already active"):
        cache.start_request("b", prompt)
    with pytest.raises(ValueError, match="not active"):
        cache.speculate("a", prompt, 4)


def test_cached_requests_are_evicted_first_in_first_out():
    cache = SuffixDecodingCache(max_tree_depth=4, max_cached_requests=3)
    outputs = {f"r{i}": [100 + 10 * i + j for j in range(5)] for i in range(5)}
    for req_id, output in outputs.items():
        cache.start_request(req_id, [1, 2])
        cache.add_active_response(req_id, output)
        cache.stop_request(req_id)
    assert list(cache.cached_requests) == ["r2", "r3", "r4"]
    expected = SuffixTree(4)
    for i, req_id in enumerate(["r2", "r3", "r4"]):
        expected.extend(i, outputs[req_id])
    assert dump(cache.global_tree) == dump(expected)
    off = SuffixDecodingCache(max_cached_requests=0)
    off.start_request("r", [1, 2])
    off.add_active_response("r", [3, 4])
    assert off.global_tree_nodes == 0 and list(off.cached_requests) == []
    assert off.speculate("r", [3, 4, 1, 2, 3], 4).token_ids == [4]    # its own tree still drafts


def test_the_global_tree_stays_within_its_node_bound_over_10000_requests():
    rng = random.Random(11)
    cache = SuffixDecodingCache(max_tree_depth=4, max_cached_requests=10000, max_tree_nodes=300)
    outputs, largest = {}, 0
    for i in range(10000):
        cache.start_request(i, [0])
        outputs[i] = []
        for _ in range(rng.randrange(1, 4)):
            tokens = [rng.randrange(40) for _ in range(rng.randrange(1, 5))]
            cache.add_active_response(i, tokens)
            outputs[i] += tokens
            largest = max(largest, cache.global_tree_nodes)
            assert cache.global_tree_nodes <= 300
        cache.stop_request(i)
    cached = list(cache.cached_requests)
    assert cached == list(range(10000 - len(cached), 10000))          # the newest, oldest evicted first
    assert largest > 250                                              # the bound was what held it
    expected = SuffixTree(4)
    for i in cached:
        expected.extend(i, outputs[i])
    assert dump(cache.global_tree) == dump(expected)


@pytest.mark.parametrize("name, kwargs", [
    ("suffix_decoding_max_tree_depth", dict(max_tree_depth=0)),
    ("suffix_decoding_max_cached_requests", dict(max_cached_requests=-1)),
    ("suffix_decoding_max_tree_nodes", dict(max_tree_nodes=0)),
])
def test_bad_settings_name_the_setting_and_its_range(name, kwargs):
    with pytest.raises(ValueError, match=rf"{name} must be in \["):
        SuffixDecodingCache(**kwargs)
