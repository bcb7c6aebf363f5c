"""check-distribution's tree mode (engine/experiments/distribution.py, `check_tree_distribution`): the first token a
drafted token tree's round emits, verified by recursive rejection sampling, against the target's p, on the seed's
three prefixes with the shipped character model and its heads. TVDs are compared with their expected value at the
sampling noise for the same number of draws (`tvd_noise`)."""
import pytest
from test_tree_round import no_blocks_used, shipped  # noqa: F401  (the shipped models' engine)

from engine.experiments.distribution import check_tree_distribution
from engine.serving.settings import SettingsError

PREFIXES = ["import ", "    return self.", "        if not "]      # the seed article's


@pytest.mark.parametrize("prompt", PREFIXES)
@pytest.mark.parametrize("method,samples", [("medusa", 20_000), ("eagle", 10_000)])
def test_a_drafted_trees_first_token_is_at_the_sampling_noise(shipped, prompt, method, samples):  # noqa: F811
    """Trees of depth 3, 4 children a node, 8 nodes, drawn anew each sample (seed 0): the first token's TVD against p
    is within 3x its expected value at the sampling noise (a 2-sigma bound even where p sits on two tokens, where
    the TVD is a half-normal count difference), while the drafter's own q at the root is more than twice that away."""
    r = check_tree_distribution(shipped, prompt, samples, 1.0, 0, None, {"model": "target-mha", "method": method})
    assert r["tree"] and r["method"] == method and r["mean_tree_nodes"] == 8
    assert (r["num_speculative_tokens"], r["speculative_eagle_topk"], r["speculative_num_draft_tokens"]) == (3, 4, 8)
    tolerance = 3 * r["tvd_noise"]
    assert r["tvd_speculative"] <= tolerance, r
    assert r["tvd_draft_only"] > 2 * tolerance
    assert 0 < r["acceptance_rate"] < 1
    assert no_blocks_used(shipped)


def test_the_tree_check_names_a_bad_setting(shipped):  # noqa: F811
    for settings, temperature, name in [({"speculative_eagle_topk": 1}, 1.0, "speculative_eagle_topk"),
                                        ({"method": "draft_model"}, 1.0, "speculative_eagle_topk"),
                                        ({"speculative_num_draft_tokens": 2}, 1.0, "speculative_num_draft_tokens"),
                                        ({}, 0.0, "temperature")]:
        with pytest.raises(SettingsError, match=name):
            check_tree_distribution(shipped, "import ", 10, temperature, 0, None, {"model": "target-mha", **settings})
    assert no_blocks_used(shipped)
