"""Token trees through the whole round (engine/spec_decode/eagle_tree.py, ngram.py, engine/serving/session.py):
EAGLE-2 dynamic trees drafted by an EAGLE head and n-gram trees of several earlier matches, verified in one target
forward with the tree mask, the accepted path's K/V kept.

- greedy: a tree's output is plain decoding's, on the shipped character model and its head (long accepted paths,
  some through a later sibling), on a random head (mostly rejections), and from n-gram lookup;
- speculative_eagle_topk 1 is the chain, bit for bit;
- the target's cache after each tree round equals the cache of plain decoding at the same length (float32, and
  int8 with 8-token blocks), check_invariants holds after each round, and closing a session mid-tree leaks no block;
- temperature 1: the first token a drafted tree emits has the target's law exactly (enumerated) and by sampling;
- bad tree settings are errors naming the setting, and a running generation keeps its old values.
"""
import numpy as np
import pytest
from test_heads import PROMPTS, random_heads

from engine.serving.registry import MODELS_DIR, InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession
from engine.serving.settings import GenerationSettings, SettingsError
from engine.spec_decode.draft import DraftParams, children_of
from engine.spec_decode.eagle_tree import DraftTree
from engine.spec_decode.sampling import probs_from_logits
from engine.spec_decode.tree_verify import verify_tree_draft
from engine.spec_decode.verify import residual_distribution

TREE = {"method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 3, "speculative_num_draft_tokens": 8}
CODE = ["class Stack:\n    def ", "def add(a, b):\n    return a", "import "]


@pytest.fixture(scope="module")
def shipped():
    return InferenceEngine(ModelRegistry.from_dir(MODELS_DIR, fetched=False), max_sessions=1)


@pytest.fixture
def random_head_engine(family):
    eng = family()
    eng.registry.set_heads("t-mha", random_heads(eng.registry.get("t-mha")))
    return eng


def rounds(engine, prompt, settings, each_round=lambda session: None):
    """Run a session to its end, calling each_round(session) at every round boundary; (events, summary)."""
    s = GenerationSession(engine, prompt, settings)
    events = []
    for e in s.events():
        events.append(e)
        if e.type == "round":                 # yielded between rounds: the session's state is a round's end
            each_round(s)
    assert events[-1].type == "done", events[-1]
    return events, events[-1].summary


def managers_check(engine):
    for m in engine.managers.values():
        m.check_invariants()


def no_blocks_used(engine):
    return all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def accepted_nodes(events):
    """Per round with a tree: the accepted path's nodes, read off its draft (tokens, parents) and its verdicts."""
    drafts = {e.round: e.tokens for e in events if e.type == "draft"}
    out = []
    for r, nodes in drafts.items():
        accepted = [e.id for e in events if e.type == "token" and e.round == r and e.status == "accepted"]
        path, node = [], -1
        for token in accepted:
            node = next(i for i, t in enumerate(nodes) if t["parent"] == node and t["id"] == token)
            path.append(node)
        out.append((nodes, path))
    return out


@pytest.mark.parametrize("topk,budget", [(2, 3), (2, 6), (3, 8), (4, 8)])
def test_a_greedy_tree_gives_plain_decodings_output_on_the_shipped_character_model(shipped, topk, budget):
    for prompt in CODE:
        _, plain = rounds(shipped, prompt, {"model": "target-mha", "method": "none", "max_tokens": 80})
        settings = {**TREE, "model": "target-mha", "max_tokens": 80, "speculative_eagle_topk": topk,
                    "speculative_num_draft_tokens": budget}
        events, tree = rounds(shipped, prompt, settings, lambda s: managers_check(shipped))
        assert tree["text"] == plain["text"] and tree["num_drafts"] > 0
        assert tree["draft_tree"] == {"topk": topk, "depth": 3, "num_draft_tokens": budget}
        drafted = accepted_nodes(events)
        assert max(len(nodes) for nodes, _ in drafted) == budget         # trees of the budget's size were verified
        assert no_blocks_used(shipped)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_greedy_trees_accept_through_later_siblings_and_reject_on_a_random_head(shipped, random_head_engine, method):
    """The shipped head's tree is accepted along a node that is not its parent's first child at least once (the
    tree found what a chain would have missed); a random head's trees are mostly rejected: both give plain output.
    EAGLE-2's trees, and Medusa's (engine/spec_decode/medusa_tree.py)."""
    events, _ = rounds(shipped, CODE[0], {**TREE, "method": method, "model": "target-mha", "max_tokens": 120})
    later = [path for nodes, path in accepted_nodes(events)
             if any(children_of([t["parent"] for t in nodes])[nodes[i]["parent"]][0] != i for i in path)]
    assert later
    for prompt in PROMPTS:
        _, plain = rounds(random_head_engine, prompt, {"model": "t-mha", "method": "none", "max_tokens": 50})
        events, tree = rounds(random_head_engine, prompt, {**TREE, "method": method, "model": "t-mha",
                                                           "max_tokens": 50},
                              lambda s: managers_check(random_head_engine))
        assert tree["text"] == plain["text"]
        assert {"rejected", "resampled"} <= {e.status for e in events if e.type == "token"}
    assert no_blocks_used(random_head_engine)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_topk_1_is_todays_chain_bit_for_bit(shipped, temperature, method):
    """speculative_eagle_topk 1 with a budget above the depth drafts the same chain as the settings left out: the
    same tokens, verdicts and uniform draws (an EAGLE head's and Medusa's heads')."""
    base = {"model": "target-mha", "method": method, "num_speculative_tokens": 4, "max_tokens": 80,
            "temperature": temperature, "seed": 7}

    def tokens(events):
        return [(e.round, e.position, e.id, e.status, e.r) for e in events if e.type == "token"]
    chain, _ = rounds(shipped, CODE[1], base)
    topk1, summary = rounds(shipped, CODE[1], {**base, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 9})
    assert tokens(topk1) == tokens(chain) and summary["draft_tree"]["topk"] == 1
    assert all(t["parent"] == i - 1 for e in topk1 if e.type == "draft" for i, t in enumerate(e.tokens))


def target_kv(session):  # -> [(K/V as float32 [2, nkv, T, hd])] per layer of the target's held tokens
    seq, mgr = session.target.seq, session.target.manager
    return [mgr.store.read(layer, seq.slots[:seq.num_tokens]) for layer in range(mgr.cfg.num_hidden_layers)]


@pytest.mark.parametrize("dtype,block_size", [("auto", 16), ("int8_per_token_head", 8)])
def test_the_cache_after_each_tree_round_is_plain_decodings(shipped, dtype, block_size):
    """At every round's end the target holds K/V for the output but its last token; against plain decoding's
    cache at the same length: equal up to float32 rounding (rows computed in one forward with the tree mask or one
    by one), in int8 up to one quantization step of a token-head's absmax."""
    cache = {"kv_cache_dtype": dtype, "block_size": block_size, "model": "target-mha", "max_tokens": 60}
    plain = {}
    rounds(shipped, CODE[0], {**cache, "method": "none"},
           lambda s: s.finish_reason or plain.setdefault(s.target.num_tokens, (list(s.target.token_ids), target_kv(s))))
    compared = []

    def check(s):
        if s.finish_reason:                   # the last round's events come after the session has closed
            return
        managers_check(shipped)
        assert s.target.token_ids == s.tokens[:-1] and s.target.seq.tree_start is None
        tokens, kv = plain[s.target.num_tokens]
        assert tokens == s.target.token_ids
        for ours, theirs in zip(target_kv(s), kv):
            step = np.abs(theirs).max(-1, keepdims=True) * (1 / 127 + 2 ** -10) if dtype != "auto" else \
                1e-5 * np.abs(theirs).max()
            assert (np.abs(ours - theirs) <= step + 1e-6).all()
        compared.append(s.target.num_tokens)
    rounds(shipped, CODE[0], {**cache, **TREE}, check)
    assert len(compared) >= 8
    assert no_blocks_used(shipped)


def drafted_tree(engine, prompt, settings, temperature=1.0):
    """A session's EAGLE-2 tree for its context after three rounds, the target's logits over it (one forward with
    the tree mask, the tree's rows then dropped), and the session's EAGLE proposer."""
    s = GenerationSession(engine, prompt, {**settings, "temperature": temperature})
    gen = s.events()
    next(e for e in gen if e.type == "round" and e.round == 3)
    params = params_of(settings, temperature)
    run, logits = s.proposer.propose(s.tokens, params, s.rng), None
    try:
        while True:
            logits = run.send(logits).run()
    except StopIteration as stop:
        draft = stop.value
    context = len(s.tokens)
    logits = s.target.extend([s.tokens[-1]] + draft.tokens, draft.attention_mask(),
                             positions=draft.verification_positions(context - 1))
    s.target.truncate(context - 1)
    gen.close()
    return draft, logits, s.proposer


def params_of(settings, temperature):
    return DraftParams(settings["num_speculative_tokens"], temperature, 1.0, 0.0, settings["speculative_eagle_topk"],
                       settings["speculative_num_draft_tokens"])


def first_token_law(tokens, q, p0):  # the root's children in order with their q rows [n, V], p at the root [V]
    """The law of the round's first token, exactly: the children tried in turn, then the residual."""
    law, mass, residual = np.zeros(len(p0)), 1.0, p0
    for x, q_x in zip(tokens, q):
        a = min(1.0, residual[x] / q_x[x])
        law[x] += mass * a
        mass *= 1 - a
        residual = residual_distribution(residual, q_x)
    return law + mass * residual


def test_a_sampled_trees_first_token_has_the_targets_law_exactly_and_by_sampling(shipped):
    """Temperature 1 on the shipped model and head, a tree of 4 children a node, 8 nodes, depth 3. The root's first
    child is drawn from the head's q and verified with it; its siblings are the head's most likely other tokens,
    each verified as its point mass. Averaged over the first child's draw, the law of the first emitted token
    (enumerated) is p. The drafter's own expansion of the root, drawn N = 10,000 times with seed 0 and verified,
    gives a TVD against p within 4x its expected value at the sampling noise, 0.5 sum_x sqrt(2 p(x)(1 - p(x)) /
    (pi N)). Verifying every child with the head's q instead (as if each had been drawn from it) leaves p by more
    than that tolerance."""
    settings = {**TREE, "model": "target-mha", "speculative_eagle_topk": 4}
    draft, logits, proposer = drafted_tree(shipped, CODE[2], settings)
    p = probs_from_logits(logits, 1.0, 1.0)
    q, head_logits = draft.q[0], draft.display_logits[0]                  # the head's q and logits at the root
    roots = children_of(draft.parents)[-1]
    assert roots == [0, 1, 2, 3] and np.allclose(q, probs_from_logits(head_logits, 1.0, 1.0))
    others = [int(x) for x in np.argsort(-head_logits, kind="stable")[:4] if x != draft.tokens[0]][:3]
    assert [draft.tokens[i] for i in roots[1:]] == others and (draft.q[roots[1:]].max(-1) == 1).all()
    exact, wrong = np.zeros(len(q)), np.zeros(len(q))
    for x in np.flatnonzero(q):                                           # the first child's every draw
        rest = [int(y) for y in np.argsort(-head_logits, kind="stable")[:4] if y != x][:3]
        exact += q[x] * first_token_law([x] + rest, [q] + [np.eye(len(q))[y] for y in rest], p[0])
        wrong += q[x] * first_token_law([x] + rest, [q] * 4, p[0])
    assert np.abs(exact - p[0]).max() <= 1e-12
    rng, n, counts = np.random.default_rng(0), 10_000, np.zeros(p.shape[1])
    depth1 = {**settings, "num_speculative_tokens": 1, "speculative_num_draft_tokens": 4}
    for _ in range(n):
        tree = DraftTree(proposer.vocab, p.shape[1], params_of(depth1, 1.0), rng)
        one = tree.draft(tree.expand(-1, head_logits[proposer.vocab.ids], None))
        counts[verify_tree_draft(one, np.repeat(logits[:1], 5, axis=0), 1.0, 1.0, rng).emitted[0]] += 1
    noise = 0.5 * np.sqrt(2 * p[0] * (1 - p[0]) / (np.pi * n)).sum()     # the TVD's expected value at the sampling noise
    tolerance = 4 * noise
    assert 0.5 * np.abs(counts / n - p[0]).sum() <= tolerance
    assert 0.5 * np.abs(wrong - p[0]).sum() > tolerance


def test_sampled_tree_rounds_keep_the_cache_whole_and_free_it(shipped):
    events, summary = rounds(shipped, CODE[0], {**TREE, "model": "target-mha", "temperature": 1.0, "max_tokens": 80},
                             lambda s: managers_check(shipped))
    assert summary["num_output_tokens"] == 80 and {"accepted", "rejected"} <= {e.status for e in events
                                                                                if e.type == "token"}
    assert no_blocks_used(shipped)


@pytest.mark.parametrize("pending", ["target", "eagle"])
def test_a_session_closed_mid_tree_leaks_no_block(shipped, pending):
    """Closed with a tree's scratch rows held: right after the target's tree forward (before keep_tree_path), or
    after the head's forward over a depth's frontier (before it drops those rows)."""
    s = GenerationSession(shipped, CODE[0], {**TREE, "model": "target-mha"})
    steps, value = s.steps(), None
    while True:
        request = steps.send(value)
        value = None
        if hasattr(request, "run"):
            value = request.run()
            runner = request.runner
            if request.positions is not None and (runner is s.target) == (pending == "target"):
                break
    assert runner.seq.tree_start is not None and not no_blocks_used(shipped)
    steps.close()
    assert no_blocks_used(shipped)
    managers_check(shipped)


def test_bad_tree_settings_name_the_setting_and_a_running_generation_keeps_its_values(shipped):
    bad = [({"speculative_eagle_topk": 0}, r"speculative_eagle_topk: must be in \[1, 8\]"),
           ({"speculative_num_draft_tokens": 65}, r"speculative_num_draft_tokens: must be in \[1, 64\]"),
           ({"num_speculative_tokens": 4, "speculative_num_draft_tokens": 3},
            r"speculative_num_draft_tokens: must be in \[num_speculative_tokens \(4\), 64\]"),
           ({"method": "draft_model", "speculative_eagle_topk": 2},
            "speculative_eagle_topk: must be 1 .* method draft_model"),
           ({"method": "eagle", "speculative_eagle_topk": 2, "rejection_sample_method": "block"},
            "rejection_sample_method: must be standard with a draft tree"),
           ({"method": "eagle", "speculative_eagle_topk": 2, "fault": "no_truncate"}, "fault: must be none")]
    for values, message in bad:
        with pytest.raises(SettingsError, match=message):
            GenerationSettings.parse(values)
    s = GenerationSession(shipped, CODE[0], {**TREE, "model": "target-mha", "max_tokens": 30})
    events = s.events()
    next(e for e in events if e.type == "round")
    for change, setting in [({"num_speculative_tokens": 9}, "speculative_num_draft_tokens"),
                            ({"method": "draft_model"}, "speculative_eagle_topk"),
                            ({"speculative_eagle_topk": 9}, "speculative_eagle_topk")]:
        with pytest.raises(SettingsError, match=setting):
            s.update_settings(change)
    s.update_settings({"speculative_num_draft_tokens": 5})                 # a good one is taken at the next round
    rest = list(events)
    assert rest[-1].type == "done" and rest[-1].summary["draft_tree"] == {"topk": 3, "depth": 3, "num_draft_tokens": 5}
    assert max(len(e.tokens) for e in rest if e.type == "draft") <= 5


def test_tree_sessions_under_the_scheduler_give_what_they_give_alone(shipped):
    """The server's path: three sessions (two drafting trees, one a chain) stepped together by one Scheduler, whose
    tree forwards run whole beside the others' batched ones: each output is its own run alone's, no block left."""
    from engine.serving.scheduler import Scheduler

    runs = [(CODE[0], {**TREE, "model": "target-mha", "max_tokens": 50}),
            (CODE[1], {**TREE, "model": "target-mha", "max_tokens": 50, "temperature": 1.0, "seed": 3}),
            (CODE[2], {"model": "target-mha", "method": "eagle", "max_tokens": 50})]
    alone = [rounds(shipped, prompt, settings)[1]["text"] for prompt, settings in runs]
    scheduler, sinks = Scheduler(), []
    for prompt, settings in runs:
        sinks.append([])
        scheduler.add(GenerationSession(shipped, prompt, settings), sinks[-1].append)
    while scheduler.step():
        managers_check(shipped)
    assert [sink[-1].summary["text"] for sink in sinks] == alone
    assert no_blocks_used(shipped)


def test_an_ngram_tree_branches_where_earlier_matches_went_on_differently_and_keeps_greedy_output(shipped):
    """A context whose last words occurred before with different continuations: the tree holds them as siblings,
    most frequent first; a repetitive prompt's greedy run with n-gram trees is plain decoding's."""
    from engine.spec_decode.ngram import ngram_tree
    context = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3, 4, 7, 1, 2, 3]    # 1 2 3 went on as 4 9, 5 6 and 4 7
    assert ngram_tree(context, 2, 2, 6, 1, 4) == ([4, 5, 9, 6, 7], [-1, -1, 0, 1, 0])
    assert ngram_tree(context, 2, 2, 2, 1, 4) == ([4, 5], [-1, -1])      # the budget: the most frequent nodes
    assert ngram_tree([1, 2, 3], 3, 2, 6, 1, 4) == ([], [])
    prompt = "def a(x):\n    return x + 1\ndef b(y):\n    return y * 2\ndef c(x):\n    return "
    _, plain = rounds(shipped, prompt, {"model": "target-mha", "method": "none", "max_tokens": 60})
    events, tree = rounds(shipped, prompt, {"model": "target-mha", "method": "ngram", "num_speculative_tokens": 4,
                                            "speculative_eagle_topk": 3, "speculative_num_draft_tokens": 10,
                                            "max_tokens": 60}, lambda s: s.finish_reason or managers_check(shipped))
    assert tree["text"] == plain["text"]
    assert any(len({t["parent"] for t in e.tokens}) < len(e.tokens) for e in events if e.type == "draft")  # siblings
    assert no_blocks_used(shipped)
