"""`method: "suffix"` end to end in the engine: greedy identity with plain decoding, the exact distribution at
temperature 1, drafts from earlier requests, the global trees' memory bound and eviction after 10,000 requests,
`--suffix-cache session` isolation, and the settings' ranges. (The trees and the rule themselves:
tests/engine/test_suffix.py.)"""
import random
import re

import numpy as np
import pytest

from engine.model.llama import forward_no_cache
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError
from engine.spec_decode.sampling import probs_from_logits
from engine.spec_decode.suffix import SOURCE_EARLIER, SOURCE_REQUEST
from engine.spec_decode.suffix_caches import SuffixCaches, TreeShape

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def run(engine, prompt=PROMPT, **settings):
    s = GenerationSession(engine, prompt, settings)
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    return events, events[-1].summary


def drafts_of(events):
    return [e for e in events if e.type == "draft"]


@pytest.mark.parametrize("gamma", [1, 4, 16])
def test_greedy_suffix_equals_plain_greedy_and_a_repeat_drafts_from_the_earlier_answer(family, gamma):
    engine = family()
    _, plain = run(engine, method="none", max_tokens=80)
    first_events, first = run(engine, method="suffix", num_speculative_tokens=gamma, max_tokens=80)
    again_events, again = run(engine, method="suffix", num_speculative_tokens=gamma, max_tokens=80)
    assert first["text"] == plain["text"] == again["text"]
    assert first["num_drafts"] > 0 and again["num_drafts"] > 0
    earlier = [d for d in drafts_of(again_events) if d.origin["source"] == SOURCE_EARLIER]
    assert earlier, "the second asking never drafted from the first answer"
    if gamma > 1:    # the answer is known: rounds of the repeat are longer than the first asking's
        assert again["mean_acceptance_length"] > first["mean_acceptance_length"]
    for d in drafts_of(first_events) + drafts_of(again_events):
        o = d.origin
        assert 1 <= len(d.tokens) <= min(gamma, o["match_len"]) and len(o["probs"]) == len(d.tokens)
        assert all(1.0 >= a >= b >= 0.1 for a, b in zip(o["probs"], o["probs"][1:] + [0.1]))   # path probabilities
        assert o["score"] == pytest.approx(sum(o["probs"]), rel=1e-6)
        assert all(t["q"] == 1.0 for t in d.tokens)              # a point mass: deterministic drafter
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_every_output_token_reaches_the_global_tree_and_a_stopped_request_stays_cached(family):
    engine = family()
    _, summary = run(engine, method="suffix", max_tokens=30)
    sizes = engine.suffix_caches.sizes()["t-mha"]
    assert sizes["cached_requests"] == 1 and sizes["trees"] == 1
    (cache,) = engine.suffix_caches._trees.values()
    tree = cache.global_tree
    (held,) = tree._seqs.values()
    ids = engine.registry.get("t-mha").tokenizer.encode(summary["text"])
    assert held == ids                                          # the whole answer, the first and last tokens too
    assert engine.suffix_caches.units == tree.num_nodes + 1


def test_drafting_switched_on_mid_run_keeps_greedy_output(family):
    engine = family()
    _, plain = run(engine, method="none", max_tokens=60)
    s = GenerationSession(engine, PROMPT, {"method": "ngram", "max_tokens": 60})
    rounds = 0
    for e in s.events():
        if e.type == "round":
            rounds += 1
            if rounds == 5:
                s.update_settings({"method": "suffix", "suffix_decoding_min_token_prob": 0.3})
        if e.type == "done":
            assert e.summary["text"] == plain["text"]
            assert e.summary["settings"]["method"] == "suffix"


def test_temperature_1_samples_the_target_distribution(family):
    """Tolerance: N = 3,000 sessions (seeds 0..N-1), each drafting one token in its first round after the first
    token. The second token's empirical law against p(t2) = sum_t1 p(t1) p(t2 | t1), computed from the model,
    within 3 times the TVD that N direct samples from that law are expected to show
    (0.5 sum sqrt(2 p (1 - p) / (pi N))); the accepted drafts' count against the sum of their exact acceptance
    probabilities p(draft | context) within 4 standard deviations; a rejected draft is never the token emitted in
    its place (the residual norm(max(0, p - q)) has no mass there when q is a point mass)."""
    engine = family()
    lm = engine.registry.get("t-mha")
    prompt = "abcdefghijklmnopqrstuvwxyz ():.=_,abcdefghijklmnopqrstuvwxyz ():.=_,"
    ids = lm.tokenizer.encode(prompt)
    V = lm.cfg.vocab_size
    p1 = probs_from_logits(forward_no_cache(lm.model, ids)[-1], 1.0)
    p2 = np.stack([probs_from_logits(forward_no_cache(lm.model, ids + [t])[-1], 1.0) for t in range(V)])
    n = 3000
    second, accepted, expected, variance, rejected = np.zeros(V), 0, 0.0, 0.0, 0
    for seed in range(n):
        events, summary = run(engine, prompt, method="suffix", temperature=1.0, seed=seed, max_tokens=3,
                              num_speculative_tokens=4)             # round 1 drafts one token (one more is left)
        t1, t2 = lm.tokenizer.encode(summary["text"])[:2]
        second[t2] += 1
        for d in drafts_of(events):
            x = d.tokens[0]["id"]
            verdict = next(e for e in events if e.type == "token" and e.round == d.round and e.position == 1)
            accepted += verdict.status == "accepted"
            if verdict.status == "rejected":
                rejected += 1
                assert t2 != x
            expected += p2[t1, x]
            variance += p2[t1, x] * (1 - p2[t1, x])
    law = p1 @ p2
    expected_tvd = 0.5 * np.sqrt(2 * law * (1 - law) / (np.pi * n)).sum()
    assert 0.5 * np.abs(second / n - law).sum() <= 3 * expected_tvd
    assert variance > 50 and rejected > 1000                # drafts were verified often enough to test
    assert abs(accepted - expected) <= 4 * np.sqrt(variance), (accepted, expected)


def test_the_global_trees_stay_within_their_bound_over_10000_requests():
    bound = 2000
    caches = SuffixCaches(max_tree_nodes=bound)
    shape = TreeShape(max_tree_depth=4, max_cached_requests=10000)
    rng = random.Random(0)
    peak = 0
    answers = {}
    for i in range(10_000):
        request = caches.start("m", shape, [1, 2, 3])
        answers[request.number] = [rng.randrange(50) for _ in range(rng.randrange(0, 8))]
        for token in answers[request.number]:
            request.add([token])
            peak = max(peak, caches.units)
        request.stop()
    assert peak <= bound and caches.units <= bound
    (cache,) = caches._trees.values()
    kept = list(cache.cached_requests)
    # first in, first out: the newest responses, a contiguous run ending with the last request
    assert kept == list(range(10_000 - len(kept), 10_000)) and len(kept) > 50
    assert caches.units == cache.global_tree_nodes + len(kept)
    assert {"m": {"nodes": cache.global_tree_nodes, "cached_requests": len(kept), "trees": 1}} == caches.sizes()
    # the bound is over every tree together: another shape's requests evict this one's oldest first
    other = TreeShape(max_tree_depth=8, max_cached_requests=10000)
    request = caches.start("m", other, [1])
    request.add(list(range(100, 250)))          # about 1,200 nodes: the two trees together exceed the bound
    assert caches.units <= bound and list(cache.cached_requests)[0] > kept[0]
    request.stop()


def test_max_cached_requests_evicts_first_in_first_out_and_0_keeps_no_global_tree(family):
    engine = family()
    prompts = ["abc abc", "xyz xyz", "hello hello"]
    for prompt in prompts:
        run(engine, prompt, method="suffix", max_tokens=10, suffix_decoding_max_cached_requests=2)
    (cache,) = engine.suffix_caches._trees.values()
    assert len(cache.cached_requests) == 2
    run(engine, "abc", method="suffix", max_tokens=10, suffix_decoding_max_cached_requests=0)
    assert engine.suffix_caches.sizes()["t-mha"]["cached_requests"] == 2      # nothing added, nothing else kept


def test_session_scope_drafts_only_from_its_own_earlier_runs(family):
    """A run's drafts are what its trees held: a first run of a prompt drafts alike in any fresh tree; the same
    prompt again drafts from the first answer (longer rounds). ("earlier_requests" alone proves nothing: the
    global tree holds the run's own answer so far too, as ArcticInference's does.)"""
    engine = family()
    engine.suffix_caches = caches = SuffixCaches(scope="session")

    def rounds(**settings):
        events, summary = run(engine, method="suffix", max_tokens=60, **settings)
        return [[t["id"] for t in d.tokens] for d in drafts_of(events)], summary["mean_acceptance_length"]

    with caches.session_scope("page-a"):
        first = rounds()
    with caches.session_scope("page-b"):
        assert rounds() == first                                   # a's answer is not b's to draft from
        with caches.session_scope("page-a"):                     # a's page again (a reconnect of its key)
            assert caches.sizes()["t-mha"]["trees"] == 1          # page-a's trees went when it closed
            assert rounds() == first
            again = rounds()
            assert again != first and again[1] > first[1]         # its own earlier run: longer rounds
            assert caches.sizes()["t-mha"]["trees"] == 2
    assert caches.sizes() == {} and caches.units == 0             # every scope closed: nothing held
    assert rounds() == first                                       # outside any session: shares with nobody
    assert rounds() == first and caches.sizes() == {}
    engine.suffix_caches = SuffixCaches(scope="shared")
    assert rounds() == first and rounds()[1] > first[1]           # shared: the repeat drafts from the first


@pytest.mark.parametrize("setting,value,interval", [
    ("suffix_decoding_max_tree_depth", 0, "[1, 64]"), ("suffix_decoding_max_tree_depth", 65, "[1, 64]"),
    ("suffix_decoding_max_cached_requests", -1, "[0, 1000000]"),
    ("suffix_decoding_max_spec_factor", -0.5, "[0.0, 16.0]"),
    ("suffix_decoding_min_token_prob", 1.01, "[0.0, 1.0]"), ("num_speculative_tokens", 17, "[1, 16]")])
def test_a_suffix_setting_out_of_range_is_an_error_naming_it_and_its_range(family, setting, value, interval):
    engine = family()
    with pytest.raises(SettingsError, match=rf"^{setting}: must be in {re.escape(interval)} \(got {value}\)$"):
        GenerationSession(engine, PROMPT, {"method": "suffix", setting: value})
    s = GenerationSession(engine, PROMPT, {"method": "suffix"})
    with pytest.raises(SettingsError, match=setting):
        s.update_settings({setting: value})
    with pytest.raises(ValueError, match="suffix cache scope must be one of shared, session"):
        SuffixCaches(scope="room")
