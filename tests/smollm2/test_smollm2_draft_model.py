"""SmolLM2's shipped draft model (models/drafts/smollm2-135m): read by the checkpoint code, exact greedy output,
consistent counts when sampling, and offered wherever SmolLM2 is."""
import numpy as np
import pytest

from engine.model.checkpoint import load_checkpoint
from engine.model.llama import Model, forward
from engine.serving.session import GenerationSession
from engine.serving.settings import GenerationSettings

NAME = "smollm2-135m"
PROMPTS = ["Explain glaciers in simple terms.", "Write a Python function that rotates a list by k positions."]


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    """SmolLM2 with its draft, as a server's registry lists them (SmolLM2's weights are the session's shared ones)."""
    from engine.serving.registry import InferenceEngine, ModelRegistry
    return InferenceEngine(ModelRegistry.from_dir(), max_sessions=2)


@pytest.fixture(scope="module")
def draft(engine):
    registry = engine.registry
    found = registry.draft_for(registry.models[NAME])
    assert found is not None and found.role == "draft"
    return registry.get(found.name)


def run(engine, prompt, **settings):
    events = list(GenerationSession(engine, prompt, {"model": NAME, "chat": True, "temperature": 0, **settings}).events())
    assert events[-1].type == "done", events[-1]
    return events[-1].summary, [e for e in events if e.type == "token"]


def test_the_draft_loads_through_the_checkpoint_code_with_the_targets_tokenizer(engine, draft):
    """Its logits over the subset S are the full checkpoint's columns of S, and the rows it adds for a context's
    token outside S give that token's logit too (engine/spec_decode/subset_draft.py)."""
    target = engine.registry.models[NAME]
    assert draft.tokenizer is target.tokenizer and draft.cfg.vocab_size == target.cfg.vocab_size
    cfg, weights, _ = load_checkpoint(draft.path, with_tokenizer=False)
    full = Model(cfg, weights)
    ids = np.array(target.tokenizer.encode("The glacier moved slowly down the valley."))
    want = forward(full, ids, 0, None)[-1]                                           # [V]
    got, hidden = forward(draft.model, ids, 0, None, with_hidden=True)
    subset = draft.model.lm_head_ids
    assert 1000 < len(subset) < cfg.vocab_size
    np.testing.assert_allclose(got[-1], want[subset], rtol=1e-4, atol=1e-4)
    outside = np.setdiff1d(np.arange(cfg.vocab_size), subset)[:5]
    rows = draft.model.lm_head_embed[outside] * draft.model.lm_head_norm
    np.testing.assert_allclose(rows @ hidden[-1], want[outside], rtol=1e-4, atol=1e-4)


def test_greedy_output_with_the_draft_equals_plain_decoding(engine, draft):
    for prompt in PROMPTS:
        plain, _ = run(engine, prompt, method="none", max_tokens=48)
        spec, _ = run(engine, prompt, method="draft_model", num_speculative_tokens=4, max_tokens=48)
        assert spec["text"] == plain["text"]
        assert spec["num_drafts"] > 0 and spec["num_accepted_tokens"] > 0, spec       # it drafts, and some hold


def test_greedy_drafts_are_the_drafts_own_argmax_over_the_accepted_text(engine, draft):
    """Each round's drafts, up to its first rejected one, are the draft's greedy chain over the text as it stands:
    the argmax (over S and the context's tokens so far) of one forward of the whole checkpoint over the final
    text. Equal output alone cannot show this (verification repairs any draft); it shows that the draft's cache
    follows the accepted text across rejections, so that its acceptance in a run is its acceptance offline.
    Positions whose top two logits are within 1e-3 are left out: another summation order may swap them."""
    cfg, weights, _ = load_checkpoint(draft.path, with_tokenizer=False)
    full = Model(cfg, weights)
    checked = 0
    for prompt in PROMPTS:
        settings = {"model": NAME, "chat": True, "temperature": 0, "max_tokens": 48, "method": "draft_model",
                    "num_speculative_tokens": 4, "enable_prefix_caching": False}
        events = list(GenerationSession(engine, prompt, settings).events())
        assert events[-1].type == "done", events[-1]
        out = [e.id for e in events if e.type == "token" and e.status != "rejected"]
        ids = np.array([t["id"] for t in events[0].prompt_tokens] + out)
        logits = forward(full, ids[:-1], 0, None)                            # [n, V]: after x_t, for x_{t+1}
        seen = np.full(cfg.vocab_size, len(ids), np.int64)
        np.minimum.at(seen, ids, np.arange(len(ids)))
        emitted = 1                                                          # the prefill's token
        for r in (e for e in events if e.type == "round" and e.num_draft_tokens):
            drafts = [e.id for e in events
                      if e.type == "token" and e.round == r.round and e.status in ("accepted", "rejected")]
            for k, d in enumerate(drafts):
                t = len(ids) - len(out) - 1 + emitted + k
                allowed = np.isin(np.arange(cfg.vocab_size), draft.model.lm_head_ids) | (seen <= t)
                top2 = np.sort(np.where(allowed, logits[t], -np.inf))[-2:]
                if top2[1] - top2[0] > 1e-3:
                    assert d == int(np.argmax(np.where(allowed, logits[t], -np.inf))), (prompt, r.round, k)
                    checked += 1
            emitted += r.num_accepted + 1
    assert checked > 40


def test_sampling_with_the_draft_counts_what_it_verified(engine, draft):
    """At temperature 1 with a fixed seed: each round ends in one rejection and its resampled token, or a bonus
    token, and the accepted tokens the stream shows are those the statistics count. The seed reproduces the run
    where the same products compute it: with the prefix cache on, how much of the prompt an earlier run left
    cached decides how many rows its remaining product has, which changes the last bits (docs/protocol.md)."""
    sampled = dict(method="draft_model", num_speculative_tokens=4, max_tokens=48, temperature=1.0, seed=7,
                   enable_prefix_caching=False)
    s, tokens = run(engine, PROMPTS[0], **sampled)
    statuses = [t.status for t in tokens]
    assert s["num_output_tokens"] == 48 and s["num_drafts"] > 0 and s["num_accepted_tokens"] > 0
    assert statuses.count("accepted") == s["num_accepted_tokens"] == sum(s["accepted_per_position"])
    assert statuses.count("rejected") == statuses.count("resampled")
    assert statuses.count("rejected") + statuses.count("bonus") == s["num_drafts"]
    assert s["num_accepted_tokens"] + statuses.count("rejected") <= s["num_draft_tokens"]
    again, _ = run(engine, PROMPTS[0], **sampled)
    assert again["text"] == s["text"]                                               # the seed reproduces the run


def test_draft_model_is_offered_on_smollm2_without_changing_its_default(engine):
    from app.views.model_options import model_options
    from engine.serving.request_fit import model_defaults, unmet

    registry = engine.registry
    target = registry.models[NAME]
    assert unmet(registry, target, GenerationSettings(model=NAME, method="draft_model")) is None
    assert {m["value"]: m["available"] for m in model_options(registry, NAME)["methods"]}["draft_model"]
    assert model_defaults(registry, target)["method"] == "eagle"          # the faster drafter stays the default


def test_q_is_a_distribution_over_the_whole_vocabulary_zero_outside_the_drafts_tokens(draft):
    """q over S and the context's tokens, zero elsewhere and summing to 1: what keeps rejection sampling exact."""
    from engine.kv.runner import RecomputeRunner
    from engine.spec_decode.draft import DraftParams
    from engine.spec_decode.subset_draft import draft_model_proposer

    tokens = draft.tokenizer.encode("Sphalerite and wurtzite are two forms of zinc sulfide.")
    gen = draft_model_proposer(RecomputeRunner(draft.model)).propose(tokens, DraftParams(4, 1.0), np.random.default_rng(0))
    request = next(gen)
    try:
        while True:
            request = gen.send(request.run())
    except StopIteration as stop:
        d = stop.value
    allowed = np.zeros(draft.cfg.vocab_size, bool)
    allowed[draft.model.lm_head_ids] = allowed[tokens] = True
    assert d.q.shape == (4, draft.cfg.vocab_size)
    np.testing.assert_allclose(d.q.sum(axis=1), 1.0, atol=1e-5)
    assert (d.q[:, ~allowed] == 0).all() and (d.q[np.arange(4), d.tokens] > 0).all()
    assert (~np.isin(tokens, draft.model.lm_head_ids)).any()          # the prompt has tokens outside S
    assert (d.q[:, np.setdiff1d(tokens, draft.model.lm_head_ids)] > 0).all()   # and q gives them probability
