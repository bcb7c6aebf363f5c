"""Draft heads (eagle, medusa): greedy output equals plain greedy, sampled output keeps p with a head whose q
covers only a subset of the vocabulary, and the head's pool leaks no blocks; every proposer keeps the Proposer
contract. Heads here have random weights (they propose poorly, so every status occurs); the shipped heads are
tested in tests/smollm2."""
import inspect

import numpy as np
import pytest
from rejection_check import rejection_check

from engine.experiments.shootout import h100_speedup, shootout
from engine.kv.dtypes import kv_bytes_per_token
from engine.kv.runner import ForwardRequest
from engine.model.llama import forward
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError
from engine.spec_decode.draft import Draft, DraftParams, Proposer
from engine.spec_decode.heads import ContextVocabulary, EagleHead, FeatureLog, MedusaHead, draft_from
from engine.spec_decode.sampling import probs_from_logits
from engine.spec_decode.verify import first_token_distribution
from engine.training import heads as head_math

PROMPTS = ["def add(a, b):\n    return a", "class point:\n    def ", "x = (a, b)\nfor i in x:\n    "]


def random_head_weights(lm, subset_size=20, seed=0):
    """Training-side weights: (eagle params, medusa params, subset, the target's final norm weight)."""
    rng = np.random.default_rng(seed)
    cfg, c = lm.cfg, lm.cfg.hidden_size
    subset = np.sort(rng.choice(cfg.vocab_size, subset_size, replace=False))
    eagle_cfg = head_math.eagle_config(cfg, subset_size)
    eagle = head_math.init_eagle(eagle_cfg, rng)
    eagle["fc.weight"] = rng.standard_normal((c, 2 * c)).astype(np.float32) / np.sqrt(c)
    medusa = {k: rng.standard_normal((c, c)).astype(np.float32) for k in head_math.init_medusa(c, 3)}
    norm_w = np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5
    return eagle, medusa, subset, norm_w


def random_heads(lm, subset_size=20, seed=0):
    cfg = lm.cfg
    eagle, medusa, subset, norm_w = random_head_weights(lm, subset_size, seed)
    target = {"embed": lm.model.embed, "head": lm.model.embed, "norm": norm_w}
    return {"eagle": EagleHead(lm.name, cfg, target, {**eagle, "vocab_subset": subset}),
            "medusa": MedusaHead(lm.name, cfg, target, {**medusa, "vocab_subset": subset})}


@pytest.fixture
def engine(family):
    eng = family()
    lm = eng.registry.get("t-mha")
    eng.registry.set_heads("t-mha", random_heads(lm))
    return eng


def run(engine, prompt=PROMPTS[0], **settings):
    s = GenerationSession(engine, prompt, {"model": "t-mha", **settings})
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    return events, events[-1].summary


def no_blocks_used(engine):
    return all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


@pytest.mark.parametrize("method,gamma", [("eagle", 1), ("eagle", 3), ("eagle", 6), ("medusa", 2), ("medusa", 3)])
def test_greedy_with_a_head_equals_plain_greedy(engine, method, gamma):
    for prompt in PROMPTS:
        _, plain = run(engine, prompt, method="none", max_tokens=60)
        events, spec = run(engine, prompt, method=method, num_speculative_tokens=gamma, max_tokens=60)
        assert spec["text"] == plain["text"]
        assert spec["num_drafts"] > 0
        statuses = {e.status for e in events if e.type == "token"}
        assert {"rejected", "resampled"} <= statuses
    assert no_blocks_used(engine)


@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle", "medusa"])
def test_every_proposer_keeps_the_proposer_contract(engine, method):
    """Mid-run, each method's proposer is a Proposer whose `propose` is a generator: it yields ForwardRequests only
    (run here one at a time; a scheduler may batch them) and returns a chain of at most k tokens, each with a
    positive q, and the drafting forwards it cost; its runner, if it keeps one, rolls back to what verification
    kept, and closing the session frees its blocks."""
    s = GenerationSession(engine, PROMPTS[0] * 2, {"model": "t-mha", "method": method, "max_tokens": 30,
                                                    "temperature": 0.9})
    events = s.events()
    next(e for e in events if e.type == "round" and e.round == 3)
    proposer, tokens = s.proposer, list(s.tokens)
    if method == "ngram":                           # a context whose last 4 tokens occurred before: a match
        tokens += tokens[:4]
    assert isinstance(proposer, Proposer) and proposer.method == method
    run = proposer.propose(tokens, DraftParams(3, 0.9), np.random.default_rng(0))
    assert inspect.isgenerator(run)
    forwards, logits = 0, None
    while True:
        try:
            request = run.send(logits)
        except StopIteration as stop:
            draft = stop.value
            break
        assert isinstance(request, ForwardRequest)
        forwards += 1
        logits = request.run()
    assert isinstance(draft, Draft) and draft.is_chain and 1 <= len(draft) <= 3
    assert all(draft.q[i, x] > 0 for i, x in enumerate(draft.tokens))
    assert draft.forward_calls == {"ngram": 0, "medusa": 3}.get(method, forwards) and forwards == (
        0 if method in ("ngram", "medusa") else len(draft))
    assert (proposer.runner is not None) == (method in ("draft_model", "eagle"))
    proposer.rollback(len(tokens))                  # as if verification rejected every draft
    if method == "draft_model":                     # it holds a prefix of the context again
        assert proposer.runner.token_ids == tokens[:proposer.runner.num_tokens]
    if method == "eagle":                           # the entries of real features only: one a position but the last
        assert proposer.runner.num_tokens == len(tokens) - 1 - proposer.start
    events.close()
    assert no_blocks_used(engine)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_gamma_and_method_changed_mid_run_keep_greedy_output(engine, method):
    _, plain = run(engine, method="none", max_tokens=80)
    s = GenerationSession(engine, PROMPTS[0], {"model": "t-mha", "method": "none", "max_tokens": 80})
    rounds, sizes = 0, []
    for e in s.events():
        if e.type == "round":
            rounds += 1
            sizes.append(e.num_draft_tokens)
            if rounds == 3:     # the head starts mid-run, on the features recorded since the prompt
                s.update_settings({"method": method, "num_speculative_tokens": 1})
            if rounds == 8:
                s.update_settings({"num_speculative_tokens": 3})
        if e.type == "done":
            summary = e.summary
    assert summary["text"] == plain["text"]
    assert sizes[:3] == [0, 0, 0] and 1 in sizes and 3 in sizes


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft_model"])
def test_a_confidence_threshold_shortens_drafts_and_keeps_the_output(engine, method):
    """`draft_confidence_threshold`: a round's draft stops at the first token the drafter's own probability of it
    is below the threshold (a round still drafts one). Greedy output equals plain greedy at every threshold;
    at 1.0 every round drafts one token, at 0 as many as without it; sampled runs stay reproducible and leak no
    blocks."""
    def draft_sizes(**settings):
        events, summary = run(engine, method=method, num_speculative_tokens=3, max_tokens=60, **settings)
        return [e.num_draft_tokens for e in events if e.type == "round"], summary
    _, plain = run(engine, method="none", max_tokens=60)
    sizes = {}
    for threshold in (0.0, 0.3, 1.0):
        sizes[threshold], spec = draft_sizes(draft_confidence_threshold=threshold)
        assert spec["text"] == plain["text"], threshold
    assert sizes[0.0] == draft_sizes()[0] and max(sizes[0.0]) == 3       # 0: the default, γ every round
    assert set(sizes[1.0]) - {0} == {1} and 1 in sizes[0.3] and max(sizes[0.3]) > 1     # 0: a last plain step
    a = draft_sizes(draft_confidence_threshold=0.3, temperature=0.8, seed=5)[1]
    assert a["text"] == draft_sizes(draft_confidence_threshold=0.3, temperature=0.8, seed=5)[1]["text"]
    assert no_blocks_used(engine)


def test_medusa_drafts_at_most_one_token_per_head(engine):
    events, _ = run(engine, method="medusa", num_speculative_tokens=8, max_tokens=30)
    assert max(e.num_draft_tokens for e in events if e.type == "round") == 3


def test_eagle_pool_is_its_own_and_is_rolled_back(engine):
    s = GenerationSession(engine, PROMPTS[1], {"model": "t-mha", "method": "eagle", "num_speculative_tokens": 4,
                                               "max_tokens": 40})
    for e in s.events():
        if e.type == "kv_blocks":
            roles = {p["role"]: p for p in e.pools}
            assert roles["eagle"]["name"] == "eagle:t-mha-eagle"
            # after a round the head holds one entry per position with a real feature: tokens - 1
            assert s.proposer.runner.num_tokens == len(s.tokens) - 1 - s.proposer.start
    assert no_blocks_used(engine)


@pytest.mark.parametrize("method", ["eagle", "draft_model", "medusa", "ngram"])
def test_metrics_give_the_draft_pools_bytes_beside_the_targets(engine, method):
    """kv_cache_bytes is the target's (the contract's kv_cache); draft_kv_cache_bytes what the draft model's or
    the EAGLE head's own cache holds, None where the drafter keeps none."""
    s = GenerationSession(engine, PROMPTS[1], {"model": "t-mha", "method": method, "num_speculative_tokens": 3,
                                               "max_tokens": 30})
    drafted = []
    for e in (e for e in s.events() if e.type == "metrics"):
        if not s.target.num_tokens:
            continue                                        # the last one: the session has freed its caches
        assert e.values["kv_cache_bytes"] == s.target.num_tokens * kv_bytes_per_token(s.target_lm.cfg, "auto")
        runner = getattr(s.proposer, "runner", None)                 # the draft model's or the EAGLE head's
        held = None if runner is None else runner.num_tokens * kv_bytes_per_token(runner.manager.cfg, "auto")
        assert (runner is None) == (method in ("medusa", "ngram"))
        assert e.values["draft_kv_cache_bytes"] == held
        drafted.append(held)
    assert drafted and (max(drafted) > 0 if method in ("eagle", "draft_model") else set(drafted) == {None})
    assert no_blocks_used(engine)


def test_no_leaked_blocks_after_rejections_stops_errors_and_disconnects(family):
    eng = family(eos_token_id=3)
    eng.registry.set_heads("t-mha", random_heads(eng.registry.get("t-mha")))
    run(eng, method="eagle", temperature=1.0, max_tokens=200)                  # stops at EOS or length
    s = GenerationSession(eng, PROMPTS[0], {"model": "t-mha", "method": "eagle", "temperature": 1.0,
                                            "max_tokens": 200})
    gen = s.events()
    for _ in range(9):
        next(gen)
    assert not no_blocks_used(eng)
    gen.close()                                                                 # the client went away
    assert no_blocks_used(eng)
    small = family(blocks_per_pool=3)
    small.registry.set_heads("t-mha", random_heads(small.registry.get("t-mha")))
    events = list(GenerationSession(small, PROMPTS[0] * 4, {"model": "t-mha", "method": "eagle"}).events())
    assert events[-1].type == "error" and "exhausted" in events[-1].message
    assert no_blocks_used(small)


def test_a_model_without_heads_refuses_them_clearly(engine):
    with pytest.raises(SettingsError, match="t-gqa has no eagle head"):
        GenerationSession(engine, "x", {"model": "t-gqa", "method": "eagle"})


def head_q_and_p(engine, temperature=1.0):
    """The target's p and a head's q (zero outside its subset) for the same position of a real context
    -> (p, q, the subset)."""
    lm = engine.registry.get("t-mha")
    head = engine.registry.heads_for(lm)["medusa"]
    ids = np.array(lm.tokenizer.encode(PROMPTS[2]))
    logits, hidden = forward(lm.model, ids, 0, None, with_hidden=True)
    p = probs_from_logits(logits[-1].astype(np.float64), temperature, 1.0)
    _, q, _ = draft_from(head.logits(hidden[-2])[0], head.subset, lm.cfg.vocab_size, temperature, 1.0,
                         np.random.default_rng(0))
    return p, q.astype(np.float64), head.subset


def test_exact_distribution_with_a_subset_head_equals_p(engine):
    p, q, ids = head_q_and_p(engine)
    outside = np.setdiff1d(np.arange(len(p)), ids)
    assert q[outside].max() == 0 and p[outside].sum() > 0.05           # the residual must cover these tokens
    assert np.abs(first_token_distribution(p, q) - p).max() <= 1e-12


def test_the_context_vocabulary_gives_the_logits_a_subset_holding_its_tokens_gives(engine):
    """The context's tokens outside S are drafted from the same LM head's rows: their logits equal those of an
    EAGLE head whose subset holds them, to float32 rounding."""
    lm = engine.registry.get("t-mha")
    eagle, _, subset, norm_w = random_head_weights(lm)
    ids = lm.tokenizer.encode(PROMPTS[1])
    target = {"embed": lm.model.embed, "head": lm.model.embed, "norm": norm_w}
    both = np.union1d(subset, ids)
    small, large = (EagleHead(lm.name, lm.cfg, target, {**eagle, "vocab_subset": s}) for s in (subset, both))
    vocab = ContextVocabulary(small)
    vocab.update(ids)
    assert sorted(vocab.ids.tolist()) == both.tolist()
    order = np.searchsorted(both, vocab.ids)                        # the larger head's column of each draft token
    _, hidden = forward(lm.model, np.asarray(ids), 0, None, with_hidden=True)
    x = small.inputs(hidden[:-1], ids[1:])
    a, h = forward(small.model, np.asarray(ids[1:]), 0, None, with_hidden=True, inputs_embeds=x)
    b = forward(large.model, np.asarray(ids[1:]), 0, None, inputs_embeds=x)
    np.testing.assert_allclose(vocab.logits(a, h * small.sqrt_c), b[:, order], rtol=1e-4, atol=1e-4)


def test_eagle_drafts_the_contexts_tokens_outside_its_subset_and_keeps_the_output(engine):
    """The head's subset here holds few of the prompt's tokens; EAGLE still proposes them (from the context
    vocabulary), greedy output equals plain greedy, and Medusa keeps to its subset."""
    _, plain = run(engine, method="none", max_tokens=40)
    lm = engine.registry.get("t-mha")
    context = set(lm.tokenizer.encode(PROMPTS[0])) | {t["id"] for t in plain["tokens"]}
    for method, head in engine.registry.heads_for(lm).items():
        events, summary = run(engine, method=method, num_speculative_tokens=3, max_tokens=40)
        assert summary["text"] == plain["text"], method
        outside = {t["id"] for e in events if e.type == "draft" for t in e.tokens} - set(head.subset.tolist())
        assert (outside and outside <= context) if method == "eagle" else not outside, method


def test_rejection_sampler_with_a_subset_head_200k_samples_matches_p(engine):
    """Tolerance: the TVD of the verified samples from p may be at most 3x that of 200,000 direct samples
    from p (or 0.003), with the same seed; the acceptance rate must match sum(min(p, q)) to +-0.005."""
    p, q, _ = head_q_and_p(engine)
    tvd, direct_tvd, acceptance = rejection_check(p, q)
    assert tvd <= 3 * max(direct_tvd, 0.003)
    assert abs(acceptance - np.minimum(p, q).sum()) <= 0.005


def test_sampled_generation_with_a_head_is_reproducible(engine):
    sampled = dict(method="eagle", temperature=0.8, seed=7, max_tokens=40, enable_prefix_caching=False)  # same products
    a = run(engine, **sampled)[1]["text"]
    b = run(engine, **sampled)[1]["text"]
    assert a == b


def test_feature_log_grows_and_keeps_rows():
    log = FeatureLog(4)

    class R:
        hidden_p0, hidden = 250, np.ones((10, 4), np.float32)
    log.record(R)
    assert len(log.rows) >= 260 and log.start == 250 and log.rows[259].sum() == 4


def test_top_rows_of_a_subset_head_match_a_full_sort_and_stay_cheap():
    """A head's q is 0 outside its subset; its top-5 (the inspector's) must equal a full sort's, rows of p too."""
    from engine.spec_decode.sampling import softmax, top_k_rows
    rng = np.random.default_rng(3)
    logits = np.full((3, 5000), -np.inf)
    logits[:, rng.choice(5000, 300, replace=False)] = rng.standard_normal((3, 300))
    rows = softmax(np.concatenate([rng.standard_normal((2, 5000)), logits]))
    for row, top in zip(rows, top_k_rows(rows)):
        assert [t for t, _ in top] == np.argsort(-row, kind="stable")[:5].tolist()
        assert [p for _, p in top] == row[np.argsort(-row, kind="stable")[:5]].tolist()
    peaked = softmax(rng.standard_normal((2, 49152)) * 4)            # the inspector's size: candidates cut first
    for row, top in zip(peaked, top_k_rows(peaked)):
        assert [t for t, _ in top] == np.argsort(-row, kind="stable")[:5].tolist()
    flat = np.full((1, 5000), 1 / 5000)                             # ties everywhere: any 5, all equal
    assert len(top_k_rows(flat)[0]) == 5 and {p for _, p in top_k_rows(flat)[0]} == {1 / 5000}
    few = np.zeros((1, 5000))
    few[0, [7, 9]] = [0.4, 0.6]                      # fewer nonzero entries than k: zeros fill the rest
    assert [t for t, _ in top_k_rows(few)[0][:2]] == [9, 7]


def test_a_chunked_prefill_gives_eagle_the_same_features_as_a_whole_one(family):
    """A prompt longer than the scheduler's token budget is prefilled in chunks; the EAGLE head must still see
    the target's hidden state at every prompt position, so it drafts exactly what it drafts after a whole
    prefill: the same drafts, hence the same acceptance counts, not only the same (exact) output."""
    from engine.serving.scheduler import Scheduler

    long_prompt = "def parse(line):\n    return line.split(),\n" * 4
    settings = {"model": "t-mha", "method": "eagle", "num_speculative_tokens": 3, "max_tokens": 40,
                "enable_prefix_caching": False}

    def summary(scheduler):
        eng = family()
        eng.registry.set_heads("t-mha", random_heads(eng.registry.get("t-mha")))
        session = GenerationSession(eng, long_prompt, settings)
        events = []
        scheduler.add(session, events.append)
        while scheduler.step():
            pass
        assert events[-1].type == "done", events[-1]
        drafts = [e.tokens for e in events if e.type == "draft"]
        return [e for e in events if e.type == "prefill_progress"], drafts, events[-1].summary

    whole_progress, whole_drafts, whole = summary(Scheduler(max_num_batched_tokens=None))
    chunked_progress, chunked_drafts, chunked = summary(Scheduler(max_num_batched_tokens=16))
    assert not whole_progress and len(chunked_progress) >= 3
    assert chunked["text"] == whole["text"] and chunked["num_draft_tokens"] > 0
    assert [[t["id"] for t in d] for d in chunked_drafts] == [[t["id"] for t in d] for d in whole_drafts]
    q_chunked = np.array([t["q"] for d in chunked_drafts for t in d])
    q_whole = np.array([t["q"] for d in whole_drafts for t in d])
    np.testing.assert_allclose(q_chunked, q_whole, atol=1e-4)   # the same features, summed in another order


def test_training_unrolled_chain_drafts_what_the_engine_drafts(family):
    """The training-time test (heads.eagle_unroll at depth 3, chain attention) computes the drafts the engine's
    EAGLE proposer makes: for every round, from the target's features up to the chain's start and the round's
    own drafts as tokens, step s at position j + s gives draft s + 1 (all of them, accepted or not), over the
    round's draft vocabulary: the subset and the tokens committed so far."""
    eng = family()
    lm = eng.registry.get("t-mha")
    eagle, medusa, subset, norm_w = random_head_weights(lm, seed=3)
    target = {"embed": lm.model.embed, "head": lm.model.embed, "norm": norm_w}
    eng.registry.set_heads("t-mha", {"eagle": EagleHead(lm.name, lm.cfg, target, {**eagle, "vocab_subset": subset})})
    s = GenerationSession(eng, PROMPTS[2], {"model": "t-mha", "method": "eagle", "num_speculative_tokens": 3,
                                            "max_tokens": 40, "enable_prefix_caching": False})
    events = list(s.events())
    emitted = [e.id for e in events if e.type == "token" and e.status != "rejected"]
    tokens = list(s.tokens)
    n_prompt = len(tokens) - len(emitted)
    _, hidden = forward(lm.model, np.asarray(tokens), 0, None, with_hidden=True)         # x / |x| at each position
    c = lm.cfg.hidden_size
    committed, rounds = n_prompt, 0
    for e in events:
        if e.type == "draft":
            drafts = [t["id"] for t in e.tokens]
            seq = tokens[:committed] + drafts
            vocab = np.union1d(subset, tokens[:committed])
            head_w = lm.model.embed[vocab] * norm_w
            j, k = committed - 2, len(drafts)                            # the chain starts at the last real feature
            f = np.zeros((1, j + k, c), np.float32)
            f[0, :j + 1] = hidden[:j + 1] * np.sqrt(c)
            emb = lm.model.embed[np.asarray(seq[1:j + k + 1])][None]
            steps = [fh for fh, _ in head_math.eagle_unroll(eagle, head_math.eagle_config(lm.cfg, len(subset)), f, emb, k)]
            assert [int(vocab[np.argmax(steps[i][0, j + i] @ head_w.T)]) for i in range(k)] == drafts
            rounds += 1
        elif e.type == "token" and e.status != "rejected":
            committed += 1
    assert rounds >= 5


def test_the_shootout_predicts_and_projects_from_the_drafts_a_threshold_let_through(engine):
    """With threshold 1 every round drafts one token, whatever γ: the prediction L / (k c + v) and the H100
    projection count that one draft forward per round (k = 1), not γ."""
    out = shootout(engine, PROMPTS[0], {"model": "t-mha", "num_speculative_tokens": 3, "max_tokens": 40,
                                        "draft_confidence_threshold": 1.0})
    lm = engine.registry.get("t-mha")
    for row in out["rows"]:
        if row["method"] in ("eagle", "medusa"):
            assert row["identical"], row["method"]
            L = row["mean_acceptance_length"]
            assert row["predicted"] == pytest.approx(L / (row["c"] + row["verify_ratio"]))
            assert row["h100"] == pytest.approx(h100_speedup(engine, lm, row["method"], L, 1.0, 40 + 64), rel=0.05)
            if row["method"] == "eagle":                      # Medusa drafts in one pass, whatever k
                assert row["h100"] > h100_speedup(engine, lm, "eagle", L, 3.0, 40 + 64)
