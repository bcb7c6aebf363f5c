"""SpecDecodeStats: the figures of a summary against their definitions, recomputed from the raw records."""
import statistics

import numpy as np
import pytest

from engine.serving.metrics import SpecDecodeStats


def test_summary_medians_and_means_equal_their_definitions_after_every_record():
    rng = np.random.default_rng(7)
    stats, times, itl = SpecDecodeStats(), {}, []
    stats.add_engine_time(0.01, first_token=True)
    stats.draft_forward(3.0, calls=2)
    for _ in range(41):      # odd and even counts, times arriving in no particular order
        n = int(rng.choice([1, 1, 2, 5]))
        ms = float(rng.exponential(0.5))
        stats.target_forward(ms, n)
        times.setdefault(n, []).append(ms)
        itl.append(float(rng.exponential(0.001)))
        stats.add_engine_time(itl[-1])
        s = stats.summary(num_output_tokens=len(itl) + 1)
        assert s["verify_ms_by_tokens"] == {k: statistics.median(v) for k, v in sorted(times.items())}
        assert s["itl_ms"] == pytest.approx(statistics.mean(itl) * 1e3, rel=1e-12)
        if 1 in times:
            assert s["draft_cost_ratio"] == pytest.approx(1.5 / statistics.median(times[1]), rel=1e-12)
    assert stats.target_ms_by_tokens == times     # the raw times, in order, for the benchmarks' means


def test_a_prefill_is_not_a_step_of_the_verify_curve():
    stats = SpecDecodeStats()
    stats.target_forward(9.0, 40, prefill=True)
    stats.target_forward(1.0, 1)
    s = stats.summary(num_output_tokens=2)
    assert s["verify_ms_by_tokens"] == {1: 1.0} and s["target_forward_calls"] == 2
