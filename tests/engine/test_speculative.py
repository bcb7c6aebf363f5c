"""Speculative decoding: exactness of greedy and of rejection sampling, n-gram lookup, no leaks."""
import numpy as np
import pytest
from rejection_check import rejection_check

from engine.serving.session import GenerationSession
from engine.spec_decode.draft import NO_DRAFT, Draft
from engine.spec_decode.faults import TEACHING_FAULTS
from engine.spec_decode.proposers import point_masses
from engine.spec_decode.sampling import probs_from_logits, top_k_rows, top_p_filter
from engine.spec_decode.ngram import ngram_propose
from engine.spec_decode.verify import first_token_distribution, verify, verify_draft, verify_greedy

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def run(engine, prompt=PROMPT, **settings):
    s = GenerationSession(engine, prompt, settings)
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    return s, events, events[-1].summary


def no_blocks_used(engine):
    return all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


@pytest.mark.parametrize("draft", ["other", "twin"])
@pytest.mark.parametrize("method,gamma", [("draft_model", 1), ("draft_model", 3), ("draft_model", 7),
                                          ("ngram", 2), ("ngram", 5)])
def test_greedy_speculative_equals_plain_greedy(family, draft, method, gamma):
    engine = family(draft=draft)
    _, _, plain = run(engine, method="none", max_tokens=80)
    _, events, spec = run(engine, method=method, num_speculative_tokens=gamma, max_tokens=80)
    assert spec["text"] == plain["text"]
    assert spec["num_output_tokens"] == 80
    statuses = {t.status for t in events if t.type == "token"}
    if method == "draft_model" and draft == "twin":
        assert spec["acceptance_rate"] == 1.0 and "bonus" in statuses
    if method == "draft_model" and draft == "other":
        assert "rejected" in statuses and "resampled" in statuses
    assert no_blocks_used(engine)


def test_gamma_changed_mid_generation_keeps_greedy_output_and_sizes_rounds(family):
    engine = family(draft="twin")
    _, _, plain = run(engine, method="none", max_tokens=90)
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "num_speculative_tokens": 2,
                                           "max_tokens": 90})
    sizes, applied = [], None
    for e in s.events():
        if e.type == "round":
            sizes.append(e.num_draft_tokens)
            if len(sizes) == 3:
                s.update_settings({"num_speculative_tokens": 5})
        if e.type == "settings_applied":
            applied = len(sizes)
        if e.type == "done":
            summary = e.summary
    assert summary["text"] == plain["text"]
    assert applied == 3                       # reported at the next round boundary
    assert sizes[:3] == [2, 2, 2] and sizes[3] == 5


def test_kv_cache_off_gives_the_same_greedy_text(family):
    engine = family()
    _, _, cached = run(engine, method="draft_model", max_tokens=40)
    _, _, recomputed = run(engine, method="draft_model", kv_cache=False, max_tokens=40)
    assert cached["text"] == recomputed["text"]


def test_exact_distribution_of_the_first_token_equals_p():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(12) * 0.5), rng.dirichlet(np.ones(12) * 0.5)
        q[rng.integers(12)] = 0
        q /= q.sum()
        assert np.abs(first_token_distribution(p, q) - p).max() <= 1e-12


def test_rejection_sampler_200k_samples_matches_p():
    """Tolerance: with 200,000 samples over 8 outcomes the TVD of direct sampling from p is ~0.003;
    we allow 3x that, and check the acceptance rate against sum(min(p, q)) to +-0.005 (~2.5 sigma)."""
    p = np.array([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02])
    q = np.array([0.10, 0.25, 0.05, 0.20, 0.10, 0.10, 0.15, 0.05])
    tvd, direct_tvd, acceptance = rejection_check(p, q)
    assert tvd <= 3 * max(direct_tvd, 0.003)
    assert abs(acceptance - np.minimum(p, q).sum()) <= 0.005


def test_temperature_and_top_p_shape_p_and_q_alike():
    logits = np.array([2.0, 1.0, 0.5, -1.0])
    g = probs_from_logits(logits, 0, 1.0)
    assert g.tolist() == [1.0, 0.0, 0.0, 0.0]
    hot = probs_from_logits(logits, 2.0, 1.0)
    cold = probs_from_logits(logits, 0.5, 1.0)
    assert hot[0] < cold[0]
    nucleus = top_p_filter(probs_from_logits(logits, 1.0), 0.8)
    assert nucleus[-1] == 0 and abs(nucleus.sum() - 1) < 1e-12


def test_greedy_verification_is_rejection_sampling_with_point_masses():
    """verify_greedy (ids only) gives what the general rule gives for the point masses of temperature 0."""
    rng = np.random.default_rng(0)
    V = 7
    for trial in range(500):
        k = int(rng.integers(1, 6))
        drafts = rng.integers(0, V, k).tolist()
        target = rng.integers(0, V, k + 1).tolist()
        target[:k] = [d if rng.random() < 0.7 else t for d, t in zip(drafts, target[:k])]   # mostly agree
        fast, fast_res = verify_greedy(drafts, target, V)
        full, full_res = verify(drafts, point_masses(drafts, V), point_masses(target, V), rng)
        assert [(v.token_id, v.status, v.p, v.q, v.accept_prob, v.position) for v in fast] == \
               [(v.token_id, v.status, v.p, v.q, v.accept_prob, v.position) for v in full]
        assert (fast_res is None) == (full_res is None)
        if fast_res is not None:
            assert fast_res.tolist() == full_res.tolist()


def test_a_draft_is_a_tree_and_a_chain_the_tree_with_one_child_a_node():
    q = point_masses([5, 6, 7, 8], 10)
    chain = Draft.chain([5, 6, 7], q[:3])
    assert chain.parents == [-1, 0, 1] and chain.depths.tolist() == [1, 2, 3] and chain.is_chain
    assert chain.attention_mask() is None                   # the causal mask: the forward's own
    tree = Draft([5, 6, 7, 8], [-1, 0, 0, 2], q)            # 5 has two children, 6 and 7; 8 follows 7
    assert not tree.is_chain and tree.depths.tolist() == [1, 2, 2, 3]
    sees = (tree.attention_mask() == 0).astype(int)         # rows and columns: the root, then the nodes
    assert sees.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    with pytest.raises(ValueError, match="node 1: parent 1"):
        Draft([5, 6], [-1, 1], q[:2])
    logits = np.random.default_rng(0).standard_normal((5, 10))
    with pytest.raises(ValueError, match="verify_tree_draft"):       # a chain's rule refuses a tree
        verify_draft(tree, logits, 0.0, 1.0, np.random.default_rng(0))


def test_a_round_that_drafts_nothing_is_a_plain_step():
    """An empty draft's verification is one row: the target's own token, as plain decoding samples it."""
    logits = np.random.default_rng(1).standard_normal((1, 50))
    greedy = verify_draft(NO_DRAFT, logits, 0.0, 1.0, np.random.default_rng(0))
    assert [(v.token_id, v.status, v.position) for v in greedy.verdicts] == [(int(logits.argmax()), "target", 1)]
    sampled = verify_draft(NO_DRAFT, logits, 0.8, 0.9, np.random.default_rng(3))
    p = probs_from_logits(logits[0], 0.8, 0.9)
    rng = np.random.default_rng(3)
    assert sampled.emitted == [int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), 49))]
    assert sampled.verdicts[0].status == "target" and sampled.num_accepted == 0


def test_each_teaching_fault_replaces_one_hook_of_the_correct_round():
    """The faults change the verification mask, the draw after a rejection or the truncation, nothing else: a
    plain step keeps its causal (batchable) forward under every fault, and the unnormalised residual raises
    numpy's own error only where the correct round drew from a residual, leaving the random stream as it was."""
    correct, rng = TEACHING_FAULTS["none"], np.random.default_rng(0)
    q, logits = probs_from_logits(rng.standard_normal((2, 30)), 1.0), rng.standard_normal((3, 30))
    draft = Draft.chain([int(np.argmin(logits[0])), 3], q)         # the target's least likely token: rejected
    assert all(fault.verification_mask(NO_DRAFT) is None for fault in TEACHING_FAULTS.values())
    full = TEACHING_FAULTS["no_causal_mask"].verification_mask(draft)
    assert correct.verification_mask(draft) is None and full.shape == (3, 3) and (full == 0).all()

    class Held:
        num_tokens = 9

        def truncate(self, n):
            self.num_tokens = n
    for name in ("none", "no_truncate"):
        runner = Held()
        TEACHING_FAULTS[name].truncate(runner, 7)
        assert runner.num_tokens == (9 if name == "no_truncate" else 7)
    faulty = TEACHING_FAULTS["unnormalized_residual"]
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    with pytest.raises(ValueError, match="sum to 1"):
        faulty.verify(draft, logits, 1.0, 1.0, a)
    right = correct.verify(draft, logits, 1.0, 1.0, b)
    assert right.verdicts[1].status == "resampled" and a.random() == b.random()
    plain = [faulty.verify(NO_DRAFT, logits[:1], 1.0, 1.0, np.random.default_rng(s)).emitted for s in range(5)]
    assert plain == [correct.verify(NO_DRAFT, logits[:1], 1.0, 1.0, np.random.default_rng(s)).emitted
                     for s in range(5)]


def test_top_k_rows_lists_each_rows_most_likely_tokens_in_order():
    p = probs_from_logits(np.random.default_rng(0).standard_normal((6, 300)), 1.0)
    expected = [[(int(i), float(row[i])) for i in np.argsort(-row)[:5]] for row in p]
    assert top_k_rows(p) == expected
    assert [len(r) for r in top_k_rows(p[:, :3])] == [3] * 6          # fewer tokens than k


def test_ngram_lookup():
    ctx = [1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3]
    assert ngram_propose(ctx, 3, 1, 4).tolist() == [4, 9, 1]      # earliest earlier match of [1, 2, 3] (vLLM's)
    assert ngram_propose([5, 6, 7], 3, 1, 4).tolist() == []
    assert ngram_propose([1, 2, 1], 4, 2, 2).tolist() == []         # needs a 2-token match
    assert ngram_propose([1, 2, 1], 4, 1, 1).tolist() == [2, 1]


def naive_ngram_propose(ctx, k, min_n, max_n):  # the definition, position by position
    L = len(ctx)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        for start in range(L - n):                      # earliest first (vLLM's); it ends before the last token
            if ctx[start:start + n] == ctx[L - n:]:
                return ctx[start + n:start + n + k]
    return []


def test_ngram_lookup_matches_the_definition_on_random_contexts():
    rng = np.random.default_rng(0)
    for trial in range(2000):
        alphabet = rng.integers(0, 50_000, int(rng.integers(1, 6)))    # few distinct ids: matches happen
        ctx = [int(t) for t in rng.choice(alphabet, int(rng.integers(1, 40)))]
        k, min_n = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 4))
        assert ngram_propose(ctx, k, min_n, max_n).tolist() == naive_ngram_propose(ctx, k, min_n, max_n), ctx


def test_sampled_generation_is_reproducible_with_a_seed(family):
    engine = family()
    sampled = dict(method="draft_model", temperature=0.8, max_tokens=50, enable_prefix_caching=False)  # same products
    a = run(engine, seed=7, **sampled)[2]["text"]
    b = run(engine, seed=7, **sampled)[2]["text"]
    c = run(engine, seed=8, **sampled)[2]["text"]
    assert a == b and a != c


def test_no_leaks_after_stops_errors_and_disconnects(family):
    engine = family(eos_token_id=3)
    run(engine, method="draft_model", max_tokens=200)                         # stops at EOS or length
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "temperature": 1.0, "max_tokens": 200})
    gen = s.events()
    for _ in range(7):
        next(gen)
    assert not no_blocks_used(engine)
    gen.close()                                                               # the client went away
    assert no_blocks_used(engine)
    s = GenerationSession(family(blocks_per_pool=3), PROMPT * 3, {"method": "draft_model"})
    events = list(s.events())                                                 # pool too small
    assert events[-1].type == "error" and "exhausted" in events[-1].message
    assert no_blocks_used(s.engine)


def test_stops_exactly_at_max_tokens_inside_a_round(family):
    engine = family(draft="twin")
    for n in (1, 2, 5, 13):
        _, _, summary = run(engine, method="draft_model", num_speculative_tokens=4, max_tokens=n)
        assert summary["num_output_tokens"] == n and summary["finish_reason"] == "length"
