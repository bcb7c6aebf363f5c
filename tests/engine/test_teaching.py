"""The teaching views' experiments (engine/experiments/traces.py) and the events' JSON round trip (replay)."""
import json

import pytest

from engine.experiments.traces import fault_comparison, first_divergence, live_pools, trace
from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model
from engine.model.tokenizer import TextTokenizer
from engine.serving.registry import SEQUENCE_TOKENS_BUDGET, InferenceEngine, LoadedModel, ModelRegistry
from engine.serving.events import EVENT_TYPES, event_from_dict
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def no_blocks_used(engine):
    return all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_every_event_survives_its_json_form(family):
    engine = family()
    events = list(GenerationSession(engine, PROMPT, {"method": "draft_model", "temperature": 1.0,
                                                     "max_tokens": 30}).events())
    seen = set()
    for e in events:
        d = json.loads(json.dumps(e.to_dict()))
        back = event_from_dict(d)
        assert type(back) is type(e) and back.to_dict() == d
        seen.add(e.type)
    assert {"started", "prefill", "draft", "token", "round", "kv", "metrics", "done"} <= seen
    assert set(EVENT_TYPES) >= seen
    with pytest.raises(ValueError, match="not an event"):
        event_from_dict({"type": "nonsense"})
    with pytest.raises(ValueError, match="token event"):
        event_from_dict({"type": "token", "round": 1})


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2          # the faulty run stopped there


def test_trace_stamps_tokens_with_the_engine_time_of_their_round(family):
    engine = family()
    t = trace(engine, PROMPT, {"method": "draft_model", "max_tokens": 25})
    assert t["error"] is None and t["num_output_tokens"] == 25 == len(t["emitted_ids"])
    assert t["summary"]["num_output_tokens"] == 25
    stamps = [tok["t_ms"] for tok in t["tokens"]]
    assert stamps == sorted(stamps) and stamps[-1] == pytest.approx(t["elapsed_ms"])
    assert t["elapsed_ms"] == pytest.approx(t["summary"]["elapsed_s"] * 1e3)
    by_round = {}
    for tok in t["tokens"]:
        by_round.setdefault(tok["round"], set()).add(tok["t_ms"])
    assert all(len(s) == 1 for s in by_round.values())        # a round's tokens arrive together
    assert no_blocks_used(engine)


def test_fault_comparison_finds_where_the_faulty_run_parts(family):
    engine = family()
    plain = trace(engine, PROMPT, {"method": "none", "max_tokens": 30})
    for fault in ("no_truncate", "no_causal_mask"):
        r = fault_comparison(engine, PROMPT, {"method": "draft_model", "max_tokens": 30, "temperature": 0.7}, fault)
        assert r["settings"]["temperature"] == 0                  # greedy: the reference is plain greedy decoding
        assert r["reference"]["emitted_ids"] == plain["emitted_ids"]
        assert r["faulty"]["settings"]["fault"] == fault and r["reference"]["settings"]["fault"] == "none"
        d = r["divergence"]
        assert d is not None, fault
        assert r["reference"]["emitted_ids"][:d] == r["faulty"]["emitted_ids"][:d]
    r = fault_comparison(engine, PROMPT, {"method": "none", "max_tokens": 60}, "unnormalized_residual")
    assert r["settings"]["method"] == "draft_model" and r["settings"]["temperature"] == 1.0
    assert r["reference"]["error"] is None
    assert "sum to 1" in r["faulty"]["error"]
    assert r["divergence"] == r["faulty"]["num_output_tokens"]   # where the failing round would have delivered
    with pytest.raises(SettingsError, match="fault"):
        fault_comparison(engine, PROMPT, {}, "none")
    assert no_blocks_used(engine)


def test_live_pools_weigh_preallocation_against_the_models_context():
    """A sequence may grow to its model's context (SmolLM2: 8,192 tokens); the pools' budget of 2,048 tokens
    per session only sizes them. The paging view's live table used the budget and its "This run" line the
    context, for one sequence: both now use the context."""
    tok = TextTokenizer.char_level("abcdefghijklmnopqrstuvwxyz ():\n.=_,")
    cfg = ModelConfig.from_name("tiny").replace(vocab_size=tok.vocab_size, eos_token_id=None,
                                                max_position_embeddings=4 * SEQUENCE_TOKENS_BUDGET)
    lm = LoadedModel("long", "target", cfg, Model(cfg, init_weights(cfg, seed=1, std=0.3)), tok)
    engine = InferenceEngine(ModelRegistry([lm]), blocks_per_pool=32)
    session = GenerationSession(engine, PROMPT, {"method": "none", "max_tokens": 40})
    events = session.events()
    tokens = 0
    while tokens < 10:
        tokens += next(events).type == "token"
    (pool,) = [p for p in live_pools(engine) if p["sequences"]]
    n, slots = pool["tokens"], pool["slots"]
    assert pool["context"] == cfg.max_position_embeddings and n > len(PROMPT)
    assert pool["prealloc"] == pytest.approx(1 - n / cfg.max_position_embeddings)
    assert slots >= n and pool["paged"] == pytest.approx(1 - n / slots)
    events.close()
    session.close()
    assert no_blocks_used(engine)
