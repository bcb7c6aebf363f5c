"""Settings changed mid-generation take effect at the next round, and report true figures."""
import pytest

from engine.kv.dtypes import kv_bytes_per_token
from engine.serving.session import GenerationSession
from engine.serving.settings import SettingsError

PROMPT = "def add(a, b):\n    return a + b\n"


def drive(session, changes_at_round):
    """Run a session, applying changes after the given round numbers; return the events."""
    events = []
    for e in session.events():
        events.append(e)
        if e.type == "round" and e.round in changes_at_round:
            session.update_settings(changes_at_round[e.round])
    return events


def metrics_after(events, applied_index):
    return next(e.values for e in events[applied_index:] if e.type == "metrics")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head"])
def test_dtype_switch_requantizes_and_reports_formula_bytes(family, dtype):
    engine = family()
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 40})
    events = drive(s, {3: {"kv_cache_dtype": dtype}})
    i = next(i for i, e in enumerate(events) if e.type == "settings_applied")
    assert events[i].changes == {"kv_cache_dtype": dtype}
    assert "re-quantized" in events[i].notes[0]
    rounds_before = [e.round for e in events[:i] if e.type == "round"]
    assert rounds_before[-1] == 3
    m = metrics_after(events, i)
    cfg = s.target_lm.cfg
    assert m["kv_bytes_per_token"] == kv_bytes_per_token(cfg, dtype)
    held = len(s.prompt_ids) + m["num_output_tokens"] - 1      # the target holds all but the last token
    assert m["kv_cache_bytes"] == kv_bytes_per_token(cfg, dtype) * held
    assert events[-1].type == "done"
    assert all(mgr.pool.num_used_blocks == 0 for mgr in engine.managers.values())


@pytest.mark.parametrize("heads,name", [(2, "t-gqa"), (1, "t-mqa")])
def test_kv_head_switch_changes_the_target_and_its_bytes(family, heads, name):
    engine = family()
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 30})
    events = drive(s, {2: {"num_kv_heads": heads}})
    i = next(i for i, e in enumerate(events) if e.type == "settings_applied")
    assert "re-prefilled" in events[i].notes[0] and events[i].cost_ms > 0
    m = metrics_after(events, i)
    assert s.target_lm.name == name
    assert m["kv_bytes_per_token"] == kv_bytes_per_token(s.target_lm.cfg, "auto")
    assert m["kv_bytes_per_token"] == 2 * 2 * heads * 8 * 4      # layers x K,V x heads x head_dim x fp32
    assert events[-1].summary["model"]["num_key_value_heads"] == heads


def test_kv_cache_off_then_on_mid_run(family):
    engine = family()
    s = GenerationSession(engine, PROMPT, {"method": "none", "max_tokens": 30})
    events = drive(s, {2: {"kv_cache": False}, 6: {"kv_cache": True}})
    applied = [e for e in events if e.type == "settings_applied"]
    assert len(applied) == 2
    assert [m.values["kv_blocks_used"] for m in events if m.type == "metrics"][3] == 0
    plain = list(GenerationSession(engine, PROMPT, {"method": "none", "max_tokens": 30}).events())[-1]
    assert events[-1].summary["text"] == plain.summary["text"]


def test_method_switch_and_heuristic_gamma(family):
    engine = family(draft="twin")
    s = GenerationSession(engine, PROMPT, {"method": "ngram", "max_tokens": 60,
                                           "num_speculative_tokens": 2})
    events = drive(s, {2: {"method": "draft_model", "num_speculative_tokens_schedule": "heuristic"}})
    sizes = [e.num_draft_tokens for e in events if e.type == "round"]
    # the twin draft is always accepted: gamma grows by 2 per round (capped by what remains)
    assert sizes[2:5] == [2, 4, 6]


def test_bad_changes_are_refused_at_once_and_generation_continues(family):
    engine = family()
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 20})
    gen = s.events()
    next(gen)
    with pytest.raises(SettingsError, match="num_speculative_tokens"):
        s.update_settings({"num_speculative_tokens": 99})
    with pytest.raises(SettingsError, match="num_kv_heads: 3 is not available"):
        s.update_settings({"num_kv_heads": 3})
    with pytest.raises(SettingsError, match="seed: cannot change during a generation"):
        s.update_settings({"seed": 5})
    with pytest.raises(SettingsError, match="unknown setting"):
        s.update_settings({"gamma": 5})
    assert list(gen)[-1].type == "done"


def test_teaching_faults_reproduce_the_seed_symptoms(family):
    engine = family()
    reference = list(GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 20}).events())[-1]
    for fault in ("no_truncate", "no_causal_mask"):   # (no_truncate also overflows the cache on long runs)
        broken = list(GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 20,
                                                         "fault": fault}).events())[-1]
        assert broken.type == "done", (fault, broken)
        assert broken.summary["text"] != reference.summary["text"], fault
    events = list(GenerationSession(engine, PROMPT, {"method": "draft_model", "temperature": 1.0,
                                                     "fault": "unnormalized_residual"}).events())
    assert events[-1].type == "error" and "sum to 1" in events[-1].message
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_making_a_kv_pool_is_part_of_no_measured_time(family, monkeypatch):
    """A pool is made on first use and its memory written then (engine.kv.cache): that is not engine time,
    neither of the first token nor of a settings change that needs a new pool. On an engine clock the test
    sets (tests/manual_clock.py), making a pool takes 1,000 s here, so that counting it anywhere would show."""
    from manual_clock import ManualClock, use_as_engine_clock

    from engine.kv.cache import KVCacheManager

    clock = use_as_engine_clock(monkeypatch, ManualClock(tick=1e-6))
    made = []
    original = KVCacheManager.__init__

    def slow_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self.dtype.name)
        clock.advance(1000.0)

    monkeypatch.setattr(KVCacheManager, "__init__", slow_init)
    engine = family()
    s = GenerationSession(engine, PROMPT, {"method": "draft_model", "max_tokens": 30})
    events = drive(s, {2: {"kv_cache_dtype": "float16"}, 4: {"num_kv_heads": 1}})
    assert made == ["auto", "auto", "float16", "float16", "float16"]   # target, draft; both again; the MQA's
    applied = [e for e in events if e.type == "settings_applied"]
    assert len(applied) == 2 and all(0 < e.cost_ms < 1000 for e in applied)
    summary = events[-1].summary
    assert 0 < summary["ttft_s"] <= summary["elapsed_s"] < 1.0, summary
