"""Offline acceptance (engine/training/head_eval.py): chains counted as greedy verification counts them."""
import numpy as np

from engine.training.head_eval import _chain_acceptance, _draft_vocabulary, _drafts, _summary


def test_a_chain_accepts_drafts_until_the_first_wrong_one():
    # correct[s, t]: draft s + 1 of the chain started at t - s is right
    correct = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool)
    counts = _chain_acceptance(correct, np.ones(4, bool), 2)
    # chains at t = 0: right, wrong; t = 1: right, right; t = 2: wrong (its second draft does not count)
    assert counts[:3].tolist() == [2, 1, 3]
    out = _summary(counts, 2)
    assert out["per_position"] == [round(2 / 3, 4), round(1 / 3, 4)]
    assert out["mean_acceptance_length"] == {1: round(1 + 2 / 3, 3), 2: 2.0}


def test_a_chain_drafts_from_the_subset_and_the_tokens_before_its_start():
    """As the engine's ContextVocabulary: a token outside S counts from the chain whose context holds it."""
    ids = np.array([5, 9, 7, 9, 8])
    rows = np.eye(10, dtype=np.float32)                            # token x's LM head row: e_x
    vocab, vrows, since = _draft_vocabulary(ids, np.array([1, 2]), rows)
    assert vocab.tolist() == [1, 2, 5, 7, 8, 9] and since.tolist() == [-1, -1, 0, 2, 4, 1]
    assert (vrows == rows[vocab]).all()
    logits = np.tile(np.arange(6, dtype=np.float32), (5, 1))      # prefers 9, then 8, 7, 5, then S's 2
    assert _drafts(logits, vocab, since, np.arange(-1, 4)).tolist() == [5, 9, 9, 9, 9]
    assert _drafts(logits[:1], vocab, since, np.array([-2])).tolist() == [2]      # nothing of the context yet


def test_chains_start_only_where_every_drafted_position_is_an_answer_position():
    correct = np.ones((3, 6), bool)
    valid = np.array([0, 1, 1, 1, 1, 0], bool)               # a prompt position first, the answer's end last
    assert _chain_acceptance(correct, valid, 3)[:4].tolist() == [2, 2, 2, 2]


def test_a_run_starts_each_chain_where_the_last_one_stopped():
    correct = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool)
    out = _summary(_chain_acceptance(correct, np.ones(4, bool), 2), 2)
    # γ = 1: chains at t = 0 (right: 2 tokens), 2 (wrong: 1), 3 (right: 2), 5 tokens in 3 rounds;
    # γ = 2: t = 0 (right, wrong: 2 tokens), t = 2 (wrong: 1), then no room for two drafts: 3 in 2
    assert out["run_acceptance_length"] == {1: round(5 / 3, 3), 2: 1.5}
    assert out["mean_acceptance_length"][2] == 2.0                # every start: the easy t = 1 counts too


def test_an_export_keeps_the_warm_start_record_when_the_heads_it_started_from_are_gone(tmp_path):
    import json

    from engine.training.head_cli import warm_start
    first = tmp_path / "first"
    first.mkdir()
    (first / "training.json").write_text(json.dumps({"steps": 730, "train_s": 3600.0,
                                                     "data": {"answer_tokens": 49743}}))
    record = {"steps": 730, "train_s": 3600.0, "answer_tokens": 49743}
    assert warm_start(str(first), tmp_path / "none.json") == record
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({"config": {"init_from": str(first)}, "warm_start": record}))
    (first / "training.json").unlink()
    assert warm_start(str(first), previous) == record                   # the same state exported before
    assert warm_start(str(tmp_path / "other"), previous) is None        # another state's record is not taken
    assert warm_start(None, previous) is None


# Token trees (head_eval's second half): a tiny random EAGLE head, and conversations whose "target" agrees with it
# often, so that chains and trees accept something.

def tiny_head(seed=0, vocab=40):
    import math

    from engine.model.config import ModelConfig
    from engine.training import heads
    rng = np.random.default_rng(seed)
    cfg = ModelConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=24, vocab_size=vocab)
    params = heads.init_eagle(cfg, rng)
    params = {k: v + 0.3 * rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
    embed = rng.standard_normal((vocab, 16)).astype(np.float32)
    return cfg, params, embed, np.float32(math.sqrt(16)), rng


def agreeing_conversation(cfg, params, embed, lm_rows, subset, rng, length=40, agree=0.75):
    """Tokens and features built as a target that often decodes what the head drafts: the next feature is the
    head's predicted one, the next token its draft with probability `agree`."""
    from engine.training import heads
    from engine.training.head_train import Conversation
    f = [rng.standard_normal(16).astype(np.float32)]
    f[0] *= 4 / np.linalg.norm(f[0])                                   # unit RMS, as the features arrive
    ids = [int(rng.integers(40)), int(rng.integers(40))]
    while len(ids) < length:
        t = len(f) - 1
        fh = list(heads.eagle_unroll(params, cfg, np.array(f)[None], embed[ids[1:t + 2]][None], 1))[0][0][0, t]
        f.append(fh)
        vocab, rows, since = _draft_vocabulary(np.array(ids), subset, lm_rows)
        draft = int(_drafts((fh @ rows.T)[None], vocab, since, np.array([t]))[0])
        ids.append(draft if rng.random() < agree else int(rng.integers(40)))
    feats = (np.array(f + [f[-1]]) / 4).astype(np.float16)          # stored as x / |x|: [L - 1, C]
    return Conversation(np.array(ids), 1, feats[:len(ids) - 1])


def test_tree_nodes_see_their_own_ancestors_only():
    """A node's predicted feature equals the chain's along its own path (eagle_unroll with that path's tokens),
    whichever siblings share its batch."""
    from engine.training import heads, llama, ops
    from engine.training.head_eval import _tree_entries
    cfg, params, embed, scale, rng = tiny_head(1)
    T, t = 12, 6
    f = rng.standard_normal((1, T, 16)).astype(np.float32)
    ids = rng.integers(0, 40, T + 1)
    path = [int(ids[t + 2]), 7, 11]                                # a drafted path below the start t
    ids_path = ids.copy()
    ids_path[t + 2:t + 5] = path
    steps = list(heads.eagle_unroll(params, cfg, f, embed[ids_path[1:T + 1]][None], 3))
    fh0 = list(heads.eagle_unroll(params, cfg, f, embed[ids[1:T + 1]][None], 1))[0]
    real_kv = tuple(x[0] for x in llama.layer_kv(fh0[1][1]))
    tables = ops.rope_tables(T, cfg.head_dim, cfg.rope_theta, np.float32)
    K, D = cfg.num_key_value_heads, cfg.head_dim
    anc = (np.zeros((2, 0, K, D), np.float32), np.zeros((2, 0, K, D), np.float32))
    feat = np.repeat(fh0[0][0, t:t + 1], 2, 0)
    for d in range(1, 3):                      # row 0 follows the path, row 1 a sibling token at each depth
        tokens = [path[d - 1], (path[d - 1] + 1) % 40]
        fh, k, v = _tree_entries(params, cfg, feat, embed[tokens], np.array([t + d] * 2), np.array([t] * 2),
                                 real_kv, anc, tables)
        assert np.abs(fh[0] - steps[d][0][0, t + d]).max() <= 1e-4
        assert np.abs(fh[1] - fh[0]).max() > 1e-3
        feat = fh[[0, 0]]
        anc = (np.concatenate([anc[0][[0, 0]], k[[0, 0]][:, None]], 1), np.concatenate([anc[1][[0, 0]], v[[0, 0]][:, None]], 1))


def test_a_dynamic_tree_of_top_1_is_the_chain_and_the_best_static_tree_beats_it():
    from engine.spec_decode.heads import LMRows
    from engine.training.head_eval import eagle_acceptance, eagle_tree_acceptance
    cfg, params, embed, scale, rng = tiny_head(2)
    lm_rows = LMRows({"head": embed, "norm": np.ones(16, np.float32)})
    subset = np.arange(0, 40, 2)
    convs = [agreeing_conversation(cfg, params, embed, lm_rows, subset, rng) for _ in range(4)]
    trees = eagle_tree_acceptance(params, cfg, convs, subset, lm_rows, embed, scale, depth=4, budgets=(1, 2, 3, 4, 8),
                                  topks=(1, 2, 3))["by_budget"]
    chains = eagle_acceptance(params, cfg, convs, subset, lm_rows, embed, 4, scale)["mean_acceptance_length"]
    assert chains[4] > 1.5                                            # the data accept something
    for n in (1, 2, 3, 4):
        assert trees[n]["chain"] == chains[n]                        # ranks along the path, counted as chains
        assert trees[n]["dynamic_by_topk"][1] == chains[n]           # top-1 trees built node by node: the chain
        assert trees[n]["static"] >= trees[n]["chain"]
        assert trees[n]["dynamic"] >= trees[n]["dynamic_by_topk"][1]
    assert trees[8]["chain"] is None and trees[8]["static"] >= trees[4]["static"]


def test_the_best_static_tree_holds_the_rank_paths_most_starts_reach():
    from engine.training.head_eval import best_static_tree, rank_path_counts
    big = 99
    ranks = np.array([[0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0], [0, big, 0], [2, 0, 0]])
    counts = rank_path_counts(ranks, 3)
    assert counts[(0,)] == 4 and counts[(0, 0)] == 2 and counts[(0, 0, 0)] == 1 and (0, big) not in counts
    assert best_static_tree(counts, 2) == [(0,), (0, 0)]             # (0, 0) ties (1,), (0, 1)... on 2; (0,) first
    tree = best_static_tree(counts, 6)
    assert all(p[:-1] in tree[:i] for i, p in enumerate(tree) if len(p) > 1)      # parents come first
    assert sum(counts[p] for p in tree) == 4 + 2 + 1 + 1 + 1 + 1


def test_accepted_nodes_are_the_true_paths_nodes_among_the_n_most_probable():
    from engine.training.head_eval import accepted_by_budget
    # one start, nodes in the order generated: depth 1 (a, b), depth 2 (a's child, b's child)
    scores = np.log(np.array([[0.6, 0.3, 0.2, 0.25]]))
    depths = np.array([1, 1, 2, 2])
    on_path = np.array([[False, True, False, True]])                  # the truth goes through b, then b's child
    out = accepted_by_budget(scores, depths, on_path, 2, (1, 2, 3, 4))
    assert out[0].tolist() == [0, 1, 1, 1]                            # cut at depth 1: b is second best
    assert out[1].tolist() == [0, 1, 2, 2]                            # b's child (0.25) beats a's (0.2)
