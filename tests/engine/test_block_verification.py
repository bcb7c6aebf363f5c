"""The `rejection_sample_method` setting in the round (engine/spec_decode/verify.py's `block` rule beside the
`standard` one): greedy output is plain decoding's under both rules, point-mass drafts stay exact, the first
emitted token keeps the target's distribution on the character models, and on the same draws block verification
accepts at least as many tokens as token-by-token verification. The rule's own math is checked exactly in
tests/engine/test_tree_verify.py."""
import numpy as np
import pytest

from engine.experiments.distribution import check_distribution
from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession
from engine.serving.settings import GenerationSettings, SettingsError
from engine.spec_decode.draft import Draft
from engine.spec_decode.verify import block_residual, block_stop_probabilities, verify_draft

PROMPT = "def add(a, b):\n    return a + b\n"


def run(engine, **settings):
    events = list(GenerationSession(engine, PROMPT, settings).events())
    return events, events[-1].summary


def test_a_bad_rule_is_an_error_naming_the_setting_and_its_values(family):
    with pytest.raises(SettingsError) as e:
        GenerationSettings.parse({"rejection_sample_method": "blocks"})
    assert str(e.value).startswith("rejection_sample_method:") and "'standard'" in str(e.value) \
        and "'block'" in str(e.value)
    s = GenerationSession(family(), PROMPT, {"method": "draft_model", "max_tokens": 12})
    events = []
    for event in s.events():
        events.append(event)
        if event.type == "round" and event.round == 1:
            with pytest.raises(SettingsError, match="rejection_sample_method"):
                s.update_settings({"rejection_sample_method": "tree"})
    assert events[-1].type == "done" and events[-1].summary["settings"]["rejection_sample_method"] == "standard"


def test_the_rule_is_live_from_the_next_round(family):
    s = GenerationSession(family(), PROMPT, {"method": "draft_model", "max_tokens": 60, "temperature": 1.0, "seed": 2})
    events = []
    for event in s.events():
        events.append(event)
        if event.type == "round" and event.round == 3:
            s.update_settings({"rejection_sample_method": "block"})
    applied = next(i for i, e in enumerate(events) if e.type == "settings_applied")
    assert events[applied].changes == {"rejection_sample_method": "block"}
    drafts = [e for e in events if e.type == "token" and e.status in ("accepted", "rejected")]
    assert drafts and all((e.stop_prob is not None) == (e.round > 3) for e in drafts)
    block_rounds = [e for e in events[applied:] if e.type == "round" and e.num_draft_tokens]
    assert events[-1].summary["block_verification"]["num_drafts"] == len(block_rounds)


@pytest.mark.parametrize("method,gamma", [("draft_model", 3), ("ngram", 4)])
def test_at_temperature_0_both_rules_are_plain_decoding(family, method, gamma):
    engine = family()
    _, plain = run(engine, method="none", max_tokens=60)
    for rule in ("standard", "block"):
        _, spec = run(engine, method=method, num_speculative_tokens=gamma, max_tokens=60, rejection_sample_method=rule)
        assert spec["text"] == plain["text"], rule
        assert spec["settings"]["rejection_sample_method"] == rule
        assert spec["block_verification"] is None          # greedy matching: no draws for the rules to differ on


def first_token_law(tokens, q, p):  # the exact law [V] of a block-verified round's first emitted token
    b, h = block_stop_probabilities(tokens, q, p)
    law, later_fail, accepted = np.zeros(p.shape[1]), 1.0, 0.0
    for tau in range(len(tokens), -1, -1):                   # P(tau) = h_tau * P(every later draw fails)
        p_tau = (h[tau] if tau else 1.0) * later_fail
        later_fail *= (1 - h[tau]) if tau else 1.0
        law += p_tau * (np.eye(p.shape[1])[tokens[0]] if tau else block_residual(b[0], p[0], q[0]))
        accepted += p_tau * tau
    return law, accepted


def test_point_mass_drafts_stay_exact_under_block_verification():
    """A drafter whose tokens are fixed (n-gram lookup; any drafter at temperature 0) has q = point masses. The
    first token's law is p exactly, and the mean accepted length equals token-by-token verification's (with
    point masses the block rule has nothing to gain). Sampled through verify_draft, the round's entry point:
    tolerance 3 sqrt(V / N) on the TVD, several times its sampling noise."""
    rng = np.random.default_rng(0)
    V = 7
    for k in range(1, 6):
        for _ in range(4):
            p = rng.dirichlet(np.ones(V) * 0.6, k + 1)
            tokens = rng.integers(0, V, k).tolist()
            law, accepted = first_token_law(tokens, np.eye(V)[tokens], p)
            np.testing.assert_allclose(law, p[0], atol=1e-12)
            assert accepted == pytest.approx(np.cumprod(p[np.arange(k), tokens]).sum(), abs=1e-12)
    p = rng.dirichlet(np.ones(V), 4)
    tokens, N = [2, 5, 1], 20_000
    draft, logits = Draft.chain(tokens, np.eye(V)[tokens]), np.log(p)
    counts = np.zeros(V)
    for _ in range(N):
        result = verify_draft(draft, logits, 1.0, 1.0, rng, "block")
        counts[result.emitted[0]] += 1
    assert result.standard_num_accepted is not None and result.verdicts[0].stop_prob is not None
    assert 0.5 * np.abs(counts / N - p[0]).sum() <= 3 * np.sqrt(V / N)


@pytest.fixture(scope="module")
def shipped():
    return InferenceEngine(ModelRegistry.from_dir(MODELS_DIR), max_sessions=1)


@pytest.mark.parametrize("prompt", ["import ", "    return self.", "        if not "])   # the seed's prefixes
def test_block_verification_keeps_the_first_token_at_the_sampling_noise(shipped, prompt):
    """20,000 rounds of 2 drafts on the shipped character models, seed 0. The TVD of the first emitted token and
    that of as many direct samples from p are each one draw of the sampling noise: the first may be at most twice
    the second. A stop rule that ignored the later drafts (h_i = min(1, p/q)) lands far above."""
    r = check_distribution(shipped, prompt, 20_000, 1.0, 0, None, "block", 2)
    assert r["rejection_sample_method"] == "block" and r["num_speculative_tokens"] == 2
    assert r["tvd_speculative"] <= 2 * r["tvd_direct"], r
    assert r["tvd_draft_only"] > 5 * r["tvd_speculative"]
    assert r["mean_acceptance_length"] >= r["standard_mean_acceptance_length"]


def test_block_accepts_at_least_as_many_as_standard_on_the_same_draws(family):
    """Temperature 1, γ = 4, eight seeds of 300 tokens: every block-verified round also says what token-by-token
    verification would have accepted with its draws (the inspector's `standard_status`). Over these rounds the
    block rule's mean acceptance length is at least the standard rule's (at these seeds by several standard
    errors of the per-round difference; the rule's expectation is proved in the paper and checked exactly in
    test_tree_verify.py)."""
    engine = family()
    block, standard, summaries = [], [], []
    for seed in range(8):
        events, summary = run(engine, method="draft_model", num_speculative_tokens=4, temperature=1.0, seed=seed,
                              max_tokens=300, rejection_sample_method="block")
        summaries.append(summary)
        rounds = {}
        for e in events:
            if e.type == "token" and e.stop_prob is not None:
                rounds.setdefault(e.round, []).append(e)
        for drafts in rounds.values():
            # token by token with the same draws: accept while r < min(1, p/q), reject at the first that fails
            passed = np.cumprod([e.r < e.accept_prob for e in drafts])
            want = ["accepted" if ok else "rejected" if i == 0 or passed[i - 1] else "unreached"
                    for i, ok in enumerate(passed)]
            assert [e.standard_status for e in drafts] == want
            block.append(sum(e.status == "accepted" for e in drafts))
            standard.append(int(passed.sum()))
        figures = summary["block_verification"]
        assert figures["num_drafts"] == summary["num_drafts"] == len(rounds)
        assert figures["mean_acceptance_length"] == pytest.approx(summary["mean_acceptance_length"])
        assert figures["standard_mean_acceptance_length"] == pytest.approx(1 + sum(standard[-len(rounds):]) / len(rounds))
    assert len(block) > 1000
    assert np.mean(block) >= np.mean(standard)


def test_what_each_rule_accepts_on_average_given_the_drafts():
    """A round's expected counts (over the draws, given its drafts): block's sum of b_i, token by token's sum of
    the products of min(1, p/q). On 20,000 rounds of 3 drafts over 4 tokens (laws fixed per prefix, seed 0) each
    rule's measured mean count is its expected one within 0.03 (about 4 standard errors), and block's expected
    count is at least standard's on every round."""
    from engine.spec_decode.verify import verify_block

    def law(prefix, which):                       # a fixed distribution per (prefix, model): p and q differ
        x = np.random.default_rng([len(prefix), *prefix, which]).random(4) ** 3
        return x / x.sum()

    rng, k = np.random.default_rng(0), 3
    got = {"block": [], "standard": [], "block expected": [], "standard expected": []}
    for _ in range(20_000):
        tokens, q = [], []
        for _ in range(k):
            q.append(law(tokens, 0))
            tokens.append(int(rng.choice(4, p=q[-1])))
        p = np.array([law(tokens[:i], 1) for i in range(k + 1)])
        r = verify_block(tokens, np.array(q), p, rng)
        assert r.expected_accepted >= r.standard_expected_accepted - 1e-12
        for name, x in zip(got, (r.num_accepted, r.standard_num_accepted, r.expected_accepted,
                                 r.standard_expected_accepted)):
            got[name].append(x)
    m = {name: np.mean(x) for name, x in got.items()}
    assert abs(m["block"] - m["block expected"]) < 0.03 and abs(m["standard"] - m["standard expected"]) < 0.03, m
    assert m["block expected"] > m["standard expected"] + 0.03, m      # these laws leave block room to gain
