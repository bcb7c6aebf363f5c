"""The seed articles' figures, reproduced by the formulas the playground shows."""
import pytest

from engine.experiments.theory import ACCELERATORS, expected_tokens_per_round, projected_speedup, worked_table
from engine.kv.dtypes import kv_bytes_per_token
from engine.kv.memory import GIB, KIB, MIB, PUBLIC_CONFIGS, calculator, paging_waste, seed_request_mix
from engine.model.config import ModelConfig


def test_second_seed_worked_table():
    """The article's table, to its two decimals (its 2.41 is 2.405 rounded up)."""
    seed = [(3.36, 2.40), (4.33, 2.41), (1.94, 1.38), (1.94, 0.88)]
    for row, (e, speedup) in zip(worked_table(), seed):
        assert row["expected_tokens"] == pytest.approx(e, abs=0.006)
        assert row["speedup"] == pytest.approx(speedup, abs=0.006)


def test_expected_tokens_limits():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0


def test_first_seed_kv_figures():
    q = PUBLIC_CONFIGS["Qwen3-8B"]
    assert q.bytes_per_token(2) == 144 * KIB
    assert calculator("Qwen3-8B", 32768, 16)["kv_bytes"] == 72 * GIB
    oss = calculator("gpt-oss-20b", 131072, 1)
    assert oss["kv_bytes"] == pytest.approx(3.0 * GIB, rel=0.005)   # 12 full layers; 12 windowed hold 128 tokens


def test_second_seed_draft_figures():
    r = calculator("Llama-3.1-8B", 8192, 1, "float16", draft="Llama-3.2-1B")
    assert r["bytes_per_token"] == 128 * KIB and r["kv_bytes"] == 1 * GIB
    assert r["draft_bytes_per_token"] == 32 * KIB and r["draft_kv_bytes"] == 256 * MIB
    assert r["draft_weight_bytes"] == pytest.approx(2.5e9, rel=0.01)


def test_public_configs_count_int8_scales_as_our_cache_does():
    """One rule everywhere: int8 keeps one float16 scale per token and KV head (engine/kv/dtypes.py), for a
    public model and its draft as for our models."""
    r = calculator("Llama-3.1-8B", 4096, 2, "int8_per_token_head", draft="Llama-3.2-1B")
    for prefix, public in (("", PUBLIC_CONFIGS["Llama-3.1-8B"]), ("draft_", PUBLIC_CONFIGS["Llama-3.2-1B"])):
        same_shape = ModelConfig(hidden_size=public.head_dim * public.num_key_value_heads,
                                 num_hidden_layers=public.num_hidden_layers,
                                 num_attention_heads=public.num_key_value_heads,
                                 num_key_value_heads=public.num_key_value_heads, head_dim=public.head_dim)
        assert r[f"{prefix}bytes_per_token"] == kv_bytes_per_token(same_shape, "int8_per_token_head")
        assert r[f"{prefix}kv_bytes"] == r[f"{prefix}bytes_per_token"] * 4096 * 2
    assert r["bytes_per_token"] == 32 * 2 * 8 * (128 * 1 + 2)          # 65 KiB: 1 KiB of it scales


def test_weights_are_parameters_times_two_bytes_and_the_total_adds_everything():
    r = calculator("Qwen3-8B", 32768, 16, draft="Llama-3.2-1B")
    assert r["weight_bytes"] == pytest.approx(16.4e9) and r["draft_weight_bytes"] == pytest.approx(2.48e9)
    assert r["total_bytes"] == pytest.approx(16.4e9 + 72 * GIB + 2.48e9 + r["draft_kv_bytes"])


def test_paging_waste_on_the_seed_request_mix():
    """The seed: 47.2% (preallocating 2,048), 0.7% (blocks of 16), 1.4% (blocks of 32) for its random mix.
    Ours is another draw of the same mix: the expected preallocation waste is 1 - 1048.5/2048 = 48.8% with a
    standard deviation of 0.9 points over 1,000 requests; block waste is about (b/2)/mean length."""
    lengths = seed_request_mix()
    assert abs(paging_waste(lengths, None) - 0.472) <= 0.025
    assert abs(paging_waste(lengths, 16) - 0.007) <= 0.001
    assert abs(paging_waste(lengths, 32) - 0.014) <= 0.001
    assert paging_waste([16, 32], 16) == 0


def test_roofline_projection_memory_bound_at_batch_1():
    acc = ACCELERATORS["H100-SXM"]
    p = projected_speedup(acc, alpha=0.8, gamma=4, target_params=8.03e9, draft_params=1.24e9,
                          kv_bytes_per_token=128 * KIB, draft_kv_bytes_per_token=32 * KIB, context=2048)
    assert p["verify_ratio"] == pytest.approx(1.0)        # memory-bound: 5 tokens cost one step
    assert 1.5 < p["speedup"] < 3.0                       # the papers' 2-3x range
    busy = projected_speedup(acc, alpha=0.8, gamma=4, target_params=8.03e9, draft_params=1.24e9,
                             kv_bytes_per_token=128 * KIB, draft_kv_bytes_per_token=32 * KIB, context=512,
                             batch=256)
    assert busy["verify_ratio"] > 2 and busy["speedup"] < p["speedup"]   # under load verification is not free


def test_projected_verify_curve_is_flat_until_compute_bound():
    from engine.experiments.theory import projected_verify_curve
    acc = ACCELERATORS["H100-SXM"]
    alone = projected_verify_curve(acc, 8.03e9, 128 * KIB, 2048, range(1, 18))
    assert alone[1] == 1 and alone[17] == pytest.approx(1.0)            # batch 1: 17 tokens cost one step
    busy = projected_verify_curve(acc, 8.03e9, 128 * KIB, 512, (1, 5), batch=256)
    assert busy[5] > 2                                                   # under load verification is not free
    p = projected_speedup(acc, 0.8, 4, 8.03e9, 1.24e9, 128 * KIB, 32 * KIB, 512, batch=256)
    assert p["verify_ratio"] == pytest.approx(busy[5])                   # the same model as projected_speedup


def test_a_runs_series_puts_its_measured_rounds_beside_the_formulas():
    """engine/experiments/theory.py's run_series (the Theory view's figures): α counts the judged drafts (a rejection ends
    its round), E is Leviathan's formula at that α, the speed-ups divide it by the cost of a round."""
    from engine.experiments.theory import RoundPoint, run_alpha, run_series, speedup_flat_verify

    # γ = 3: all accepted (3 + bonus), one rejected at position 2 (1 accepted), one plain round without drafts
    points = [RoundPoint(2.0, 0.3, 4, 3, 3), RoundPoint(2.0, 0.3, 2, 3, 1), RoundPoint(1.0, 0.0, 1, 0, 0)]
    r = run_series(points, t1_ms=1.0, verify_ratio={1: 1.0, 4: 2.0}, method="draft_model")
    alpha = (3 + 1) / (3 + 2)                                   # 4 accepted of 5 judged
    assert run_alpha(points) == pytest.approx(alpha) == pytest.approx(r["summary"]["alpha"])
    assert r["tokens"] == pytest.approx([4.0, 3.0, 7 / 3])
    e = (2 * expected_tokens_per_round(alpha, 3) + 1) / 3       # weighted by rounds of each γ
    assert r["summary"]["e"] == pytest.approx(e)
    assert r["summary"]["flat"] == pytest.approx(3 * e / (2 * (3 * 0.1 + 1) + 1))
    assert r["summary"]["curve"] == pytest.approx(3 * e / (2 * (3 * 0.1 + 2.0) + 1))
    assert r["summary"]["estimated"] == pytest.approx(1.0 * (7 / 3) / 2.3)  # t(1) x tokens per call / median round
    assert r["e"][0] == pytest.approx(expected_tokens_per_round(1.0, 3)) and r["e"][0] == 4
    assert speedup_flat_verify(alpha, 3, 0.1) == pytest.approx(expected_tokens_per_round(alpha, 3) / 1.3)
    assert [p["rate"] for p in r["positions"]] == [1.0, 0.5, 0.5]
    assert [p["formula"] for p in r["positions"]] == pytest.approx([alpha, alpha ** 2, alpha ** 3])
    # c measured inside the run: 0.6 ms of drafting over 6 draft tokens, over t(1)
    assert r["summary"]["gamma"] == 3 and r["summary"]["verify_ratio"] == 2.0 and r["summary"]["c"] == pytest.approx(0.1)
    # nothing proposed: no α, no predictions
    plain = run_series(points[2:], 1.0, {1: 1.0}, "none")
    assert plain["summary"]["alpha"] is None and plain["e"] == [None] and plain["positions"] == []


def test_a_verify_curve_below_t1_beyond_its_noise_is_not_physical():
    from engine.experiments.measure import physical_check, relative_noise

    assert physical_check({1: 10.0, 2: 9.0, 3: 12.0}, noise=0.02) == [2]        # t(2)/t(1) = 0.9: impossible
    assert physical_check({1: 10.0, 2: 9.9, 3: 12.0}, noise=0.02) == []         # within the noise
    assert physical_check({1: 10.0, 2: 9.0, 5: 8.0}, noise=0.15) == [5]
    assert relative_noise([9.0, 10.0, 10.0, 11.0, 10.0]) == pytest.approx(0.05, abs=0.03)


def test_the_verify_curve_is_physical_with_its_noise_age_and_load(family):
    from engine.experiments.measure import verify_cost_steps
    from engine.serving.jobs import run_to_end

    engine = family()
    lm = engine.registry.get("t-mha")
    curve = run_to_end(verify_cost_steps(engine.registry, lm))
    t = curve["target_ms"]
    assert curve["physical"] and curve["violations"] == [] and curve["attempts"] in (1, 2)
    assert all(t[n] >= t[1] * (1 - curve["noise"]) for n in t)
    assert curve["repeats"] >= 11 and len(curve["load_average"]) == 3 and curve["taken_at"] > 0


def test_suffix_decoding_s_draft_length_follows_its_match_length():
    """The bound is min(γ, factor × match, depth − match); the series keeps each round and averages per match."""
    from engine.experiments.theory import SuffixRound, suffix_draft_bound, suffix_series

    assert [suffix_draft_bound(m, 16, 1.0, 24) for m in (0, 1, 5, 12, 16, 20, 24, 30)] == [0, 1, 5, 12, 8, 4, 0, 0]
    assert suffix_draft_bound(3, 16, 0.5, 24) == 1 and suffix_draft_bound(10, 4, 2.0, 64) == 4
    rounds = [SuffixRound(2, 2, 1), SuffixRound(6, 4, 4), SuffixRound(2, 1, 0), SuffixRound(9, 4, 3)]
    s = suffix_series(rounds, 4, 1.0, 24)
    assert (s["match_len"], s["drafted"], s["accepted"], s["bound"]) == ([2, 6, 2, 9], [2, 4, 1, 4], [1, 4, 0, 3],
                                                                         [2, 4, 2, 4])
    assert s["by_match"] == [{"match_len": 2, "rounds": 2, "drafted": 1.5, "accepted": 0.5, "bound": 2},
                             {"match_len": 6, "rounds": 1, "drafted": 4, "accepted": 4, "bound": 4},
                             {"match_len": 9, "rounds": 1, "drafted": 4, "accepted": 3, "bound": 4}]
    assert suffix_series([], 4, 1.0, 24) is None


def test_a_tree_round_counts_its_depth_in_e_and_its_nodes_in_the_cost():
    """A tree of 8 nodes and depth 3 is judged as a chain of 3 (its path) and costs 8 draft tokens and 9 rows."""
    from engine.experiments.theory import RoundPoint, run_alpha, run_series

    # depth 3 fully accepted (3 + bonus); depth 3 with 1 accepted (the path stopped at depth 2)
    points = [RoundPoint(2.0, 0.8, 4, 8, 3, depth=3), RoundPoint(2.0, 0.8, 2, 8, 1, depth=3)]
    r = run_series(points, t1_ms=1.0, verify_ratio={1: 1.0, 9: 3.0}, method="eagle")
    alpha = (3 + 1) / (3 + 2)                   # a fully accepted path was judged 3 times, not 8
    assert run_alpha(points) == pytest.approx(alpha) == pytest.approx(r["summary"]["alpha"])
    assert r["summary"]["e"] == pytest.approx(expected_tokens_per_round(alpha, 3))
    assert r["summary"]["c"] == pytest.approx(0.1)                       # 1.6 ms over 16 nodes
    assert r["summary"]["curve"] == pytest.approx(expected_tokens_per_round(alpha, 3) / (8 * 0.1 + 3.0))
    assert r["summary"]["gamma"] == 8 and r["summary"]["verify_ratio"] == 3.0
    assert [p["rate"] for p in r["positions"]] == [1.0, 0.5, 0.5]
