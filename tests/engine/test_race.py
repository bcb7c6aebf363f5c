"""A race of two settings (engine/experiments/race.py): each side's figures are the engine's, the verdict quotes them."""
import statistics

import pytest

from engine.experiments.compare import NO_CLEAR_DIFFERENCE, speedup
from engine.experiments.race import default_values, race, race_choices, verdict
from engine.external.engine_race import OURS, engine_pair, their_weight_bytes
from engine.external.openai_stream import ExternalEngine
from engine.kv.dtypes import kv_bytes_per_token
from engine.serving.registry import ModelRegistry
from engine.serving.settings import SettingsError

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def test_plain_against_speculative_greedy_writes_the_same_text_both_ways(family):
    engine = family(draft="twin")
    r = race(engine, PROMPT, {"method": "draft_model", "num_speculative_tokens": 4, "max_tokens": 40})
    a, b = r["lanes"]
    assert (a["value"], b["value"]) == ("none", "draft_model") and r["same_text"]
    assert a["run"]["num_output_tokens"] == b["run"]["num_output_tokens"] == 40
    assert a["run"]["rounds"] == 39 and b["run"]["rounds"] < 39    # the twin draft is always accepted
    assert {t["status"] for t in a["run"]["tokens"]} == {"target"}
    # the speed-up is the comparison's (engine/experiments/compare.py): the median of its interleaved rounds
    assert r["repeats"] >= 3 and r["verdict"]["low"] <= r["verdict"]["speedup"] <= r["verdict"]["high"]
    assert f"over {r['repeats']} interleaved rounds" in r["verdict"]["text"]
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_mha_against_mqa_quotes_the_cache_formula(family):
    engine = family()
    target = engine.registry.default_target()
    variants = engine.registry.variants(target)
    r = race(engine, PROMPT, {"method": "none", "max_tokens": 12}, "num_kv_heads", None)   # the default pair
    a, b = r["lanes"]
    assert (a["value"], b["value"]) == (max(variants), 1)
    assert a["label"].startswith("MHA") and b["label"] == "MQA (1 KV head)"
    for lane in (a, b):
        assert lane["figures"]["kv_bytes_per_token"] == kv_bytes_per_token(variants[lane["value"]].cfg, "auto")
    ratio = a["figures"]["kv_bytes_per_token"] / b["figures"]["kv_bytes_per_token"]
    assert r["verdict"]["kv_ratio"] == ratio and f"{ratio:.1f}× fewer KV bytes/token" in r["verdict"]["text"]
    assert set(race_choices(engine.registry, target)) == {"method", "kv_cache", "num_kv_heads", "kv_cache_dtype",
                                                          "num_speculative_tokens", "speculative_eagle_topk",
                                                          "speculative_num_draft_tokens"}


def test_a_race_of_methods_offers_only_what_its_target_can_run(family):
    """SmolLM2 on the page: no draft model shares its vocabulary, an EAGLE head is trained for it."""
    engine = family()
    target = engine.registry.default_target()

    def methods(registry):
        return [v for v, _ in race_choices(registry, target)["method"]]

    assert methods(engine.registry) == ["none", "draft_model", "ngram"]
    assert default_values(engine.registry, target, "method") == ("none", "draft_model")
    alone = ModelRegistry(engine.registry.targets)                       # no draft model at all
    assert methods(alone) == ["none", "ngram"] and default_values(alone, target, "method") == ("none", "ngram")
    alone.set_heads(target.name, {"eagle": None})
    assert methods(alone) == ["none", "ngram", "eagle"]
    assert default_values(alone, target, "method") == ("none", "eagle")


def test_kv_cache_off_holds_nothing_and_writes_the_same_greedy_text(family):
    engine = family()
    r = race(engine, PROMPT, {"method": "none", "max_tokens": 12}, "kv_cache", ("true", "false"))
    a, b = r["lanes"]
    assert b["figures"]["kv_bytes_per_token"] == 0 and a["figures"]["kv_bytes_per_token"] > 0
    assert r["same_text"] and r["verdict"]["text"].startswith("KV cache off: no KV cache held")


def test_a_gamma_race_proposes_even_when_the_form_says_none(family):
    r = race(family(), PROMPT, {"method": "none", "max_tokens": 12}, "num_speculative_tokens", ("2", "6"))
    assert r["settings"]["method"] == "draft_model" and [l["label"] for l in r["lanes"]] == ["γ = 2", "γ = 6"]
    assert all(l["figures"]["acceptance_rate"] is not None for l in r["lanes"])


def test_a_race_needs_two_different_values_of_a_race_setting(family):
    engine = family()
    with pytest.raises(SettingsError, match="race: one of"):
        race(engine, PROMPT, {}, "top_p", ("0.5", "1"))
    with pytest.raises(SettingsError, match="two different values"):
        race(engine, PROMPT, {}, "kv_cache_dtype", ("fp32", "auto"))       # an alias of the same dtype
    with pytest.raises(SettingsError, match="kv_cache_dtype"):
        race(engine, PROMPT, {}, "kv_cache_dtype", ("auto", "float64"))


def test_the_verdict_reads_ratios_both_ways_and_quotes_the_comparison():
    fa = {"kv_bytes_per_token": 1000, "ms_per_token": 2.0, "acceptance_rate": None, "mean_acceptance_length": None}
    fb = {"kv_bytes_per_token": 4000, "ms_per_token": 4.0, "acceptance_rate": None, "mean_acceptance_length": None}
    v = verdict("B", fa, fb, speedup([0.5, 0.48, 0.52], 3))
    assert v["text"] == "B: 4.0× more KV bytes/token, engine time per token 2.00× slower (0.48–0.52× over 3 " \
                        "interleaved rounds)." and v["speedup"] == 0.5 and v["speed_verdict"] == "slower"
    v = verdict("A", fb, fa, speedup([2.0, 0.9, 2.1], 3))
    assert v["text"] == "A: 4.0× fewer KV bytes/token, engine time per token no clear difference here (2.00×; " \
                        "0.90–2.10× over 3 interleaved rounds, not clear of 0.95–1.05×)." \
        and v["speed_verdict"] == "no clear difference here"


# Races timed by a clock the test controls (the comparison's `run_ms`): every run is the engine's, only its ms per
# token is given. Round r's load multiplies both sides' times alike (DRIFT: 0.6-1.8x from round to round, each
# side's own run-to-run spread far wider than the speed-up), as the rounds are interleaved for.
DRIFT = (1.0, 1.8, 0.6, 1.3, 0.7, 1.5)


def paired_clock(setting: str, a_value, ratios) -> dict:
    """ms per token for each timed run as it ends: 2 ms times round r's DRIFT, side b ratios[r] times faster."""
    seen = {"a": 0, "b": 0}

    def run_ms(run: dict) -> float:
        side = "a" if run["settings"][setting] == a_value else "b"
        r = seen[side]
        seen[side] += 1
        return 2.0 * DRIFT[r] / (ratios[r] if side == "b" else 1.0)
    return run_ms


def test_a_race_whose_sides_time_alike_round_by_round_says_no_clear_difference(family):
    """Both sides take the same time in every round, however the rounds differ: the identical settings' case."""
    r = race(family(draft="twin"), PROMPT, {"method": "draft_model", "max_tokens": 12}, repeats=len(DRIFT),
             run_ms=paired_clock("method", "none", [1.0] * len(DRIFT)))
    v = r["verdict"]
    assert (v["speed_verdict"], v["speedup"], v["low"], v["high"]) == (NO_CLEAR_DIFFERENCE, 1.0, 1.0, 1.0)
    assert "engine time per token no clear difference here (1.00×; 1.00–1.00× over 6 interleaved rounds, not " \
           "clear of 0.95–1.05×)" in v["text"]


def test_a_race_whose_paired_spread_lies_above_the_floor_says_faster(family):
    """The spread of the race that once said "no clear difference here (1.21×; 1.12–1.35× over 6 interleaved
    rounds)": its rounds' ratios lie wholly above 1.05, though each side's own runs spread 0.6-1.8x."""
    ratios = (1.21, 1.12, 1.35, 1.18, 1.30, 1.25)
    r = race(family(draft="twin"), PROMPT, {"method": "draft_model", "max_tokens": 12}, repeats=len(DRIFT),
             run_ms=paired_clock("method", "none", ratios))
    a, b = r["lanes"]
    assert a["figures"]["ms_per_token"] == pytest.approx(2.0 * statistics.median(DRIFT))
    v = r["verdict"]
    assert v["speed_verdict"] == "faster" and v["speedup"] == pytest.approx(statistics.median(ratios))
    assert (v["low"], v["high"]) == pytest.approx((1.18, 1.30))     # the 2nd lowest and highest of 6 rounds
    assert "engine time per token 1.23× faster (1.18–1.30× over 6 interleaved rounds)" in v["text"]


def test_an_engine_race_pairs_our_engine_on_our_model_with_a_configured_server():
    assert engine_pair(None, ["llama.cpp"], "smollm2-135m") == (OURS, "llama.cpp")
    for values, names, model, field in ((("llama.cpp", OURS), ["llama.cpp"], None, "race"),
                                        ((OURS, "vllm"), ["llama.cpp"], None, "race"),
                                        (None, [], None, "race"),
                                        (None, ["llama.cpp"], "llama.cpp", "model")):
        with pytest.raises(SettingsError, match=f"{field}: "):
            engine_pair(values, names, model)


def test_an_engine_race_knows_the_weight_bytes_of_a_server_of_our_checkpoint_at_our_dtype():
    """llama.cpp publishes its file's size; vLLM publishes none, but the servers we start serve our checkpoint in
    float32, so they read what we read; a server of another model or dtype is not guessed."""
    llamacpp = ExternalEngine("llama.cpp", "http://127.0.0.1:1/v1", description={"published": {"size": 91_000_000}})
    vllm = ExternalEngine("vLLM", "http://127.0.0.1:2/v1", "smollm2-135m", description={"dtype": "float32"})
    other = ExternalEngine("vLLM", "http://127.0.0.1:2/v1", "smollm2-360m", description={"dtype": "float32"})
    half = ExternalEngine("vLLM", "http://127.0.0.1:2/v1", "smollm2-135m", description={"dtype": "bfloat16"})
    assert their_weight_bytes(llamacpp, "smollm2-135m", 538_000_000) == 91_000_000
    assert their_weight_bytes(vllm, "smollm2-135m", 538_000_000) == 538_000_000
    assert their_weight_bytes(other, "smollm2-135m", 538_000_000) is None
    assert their_weight_bytes(half, "smollm2-135m", 538_000_000) is None
