"""SmolLM2 with its shipped EAGLE head drafting EAGLE-2 trees (engine/spec_decode/eagle_tree.py) and its Medusa heads
drafting Medusa's trees (engine/spec_decode/medusa_tree.py): greedy output is plain decoding's, the trees are
verified whole, and no KV block is left behind; sampled, a tree's first token keeps p (check-distribution's tree mode)."""
import pytest

PROMPT = "Explain glaciers in simple terms."          # held out: a subject the head never saw


@pytest.mark.parametrize("method,topk,budget", [("eagle", 2, 6), ("eagle", 4, 8), ("medusa", 4, 8)])
def test_a_greedy_tree_gives_plain_decodings_output(smollm2_engine, run_session, method, topk, budget):
    plain, _ = run_session(PROMPT, chat=True, method="none", max_tokens=24)
    tree, _ = run_session(PROMPT, chat=True, method=method, num_speculative_tokens=3, speculative_eagle_topk=topk,
                          speculative_num_draft_tokens=budget, draft_confidence_threshold=0, max_tokens=24)
    assert tree["text"] == plain["text"] and tree["num_drafts"] > 0
    assert tree["draft_tree"] == {"topk": topk, "depth": 3, "num_draft_tokens": budget}
    assert tree["num_draft_tokens"] > 3 * tree["num_drafts"]           # more nodes a round than a chain of 3
    assert all(m.pool.num_used_blocks == 0 for m in smollm2_engine.managers.values())


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_a_sampled_trees_first_token_is_at_the_sampling_noise(smollm2_engine, method):
    """check-distribution's tree mode on SmolLM2 (engine/experiments/distribution.py): trees of depth 3, top-4, 8
    nodes, drawn 2,000 times with seed 0 by its shipped heads; the first token's TVD against p is within 1.5x its
    expected value at the sampling noise (a sum over thousands of tokens, it varies little about that value), and
    the head's own q at the root is further than that."""
    from engine.experiments.distribution import check_tree_distribution
    r = check_tree_distribution(smollm2_engine, PROMPT, 2_000, 1.0, 0, None,
                                {"model": "smollm2-135m", "chat": True, "method": method})
    assert r["tree"] and r["mean_tree_nodes"] == 8 and r["target"] == "smollm2-135m"
    assert r["tvd_speculative"] <= 1.5 * r["tvd_noise"] < r["tvd_draft_only"], r
    assert all(m.pool.num_used_blocks == 0 for m in smollm2_engine.managers.values())
