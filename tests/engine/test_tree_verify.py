"""Token trees (engine/spec_decode/tree_verify.py) and block verification (engine/spec_decode/verify.py): the tree
mask and positions, greedy trees, and exactness at temperature 1, exactly (by enumerating the draws) and by
sampling.

The sampled checks run a small "language model": the target's and the draft's next-token distributions depend
on the previous token (rows of P and Q over V = 6 tokens), so the second emitted token tests that verification
goes on correctly below an accepted node. Tolerance: the TVD of N samples over m outcomes from the exact law is
about 0.4 sqrt(m / N) (0.5 sum_x sqrt(2 p(x) / (pi N))); we allow 3 sqrt(m / N), about 7x that, and check that
a wrong rule fails by more."""
import bisect
import itertools

import numpy as np
import pytest

from engine.spec_decode.sampling import sample
from engine.spec_decode.draft import children_of, tree_depths, tree_mask, tree_positions
from engine.spec_decode.tree_verify import verify_tree, verify_tree_greedy, without_drawn
from engine.spec_decode.verify import (acceptance_probability, block_residual, block_stop_probabilities,
                                       residual_distribution, verify, verify_block, verify_greedy)

V = 6


def random_parents(rng, n):
    return [int(rng.integers(-1, i)) for i in range(n)]


def markov_pair(seed, concentration=0.6):
    """Target rows P[prev] and draft rows Q[prev]: p(x | previous token), q(x | previous token)."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(V) * concentration, V), rng.dirichlet(np.ones(V) * concentration, V)


def tvd(counts, law):
    return 0.5 * np.abs(counts / counts.sum() - law).sum()


def test_tree_mask_is_the_ancestor_walk():
    rng = np.random.default_rng(0)
    for n in [1, 2, 5, 16, 40]:
        parents = random_parents(rng, n)
        expected = np.zeros((n, n), bool)
        depth = []
        for i in range(n):
            j, d = i, 0
            while j >= 0:                                   # walk up to the root
                expected[i, j] = True
                j, d = parents[j], d + 1
            depth.append(d)
        assert (tree_mask(parents) == expected).all()
        assert tree_depths(parents).tolist() == depth
        assert tree_positions(parents, 37).tolist() == [37 + d for d in depth]
    chain = list(range(-1, 7))
    assert (tree_mask(chain) == np.tri(8, dtype=bool)).all()     # a chain's is the causal mask


def test_children_are_tried_in_node_order():
    assert children_of([-1, -1, 0, 1, 0]) == {-1: [0, 1], 0: [2, 4], 1: [3], 2: [], 3: [], 4: []}


def target_argmax(path):
    """A deterministic 'target': its greedy next token after a sequence of tokens."""
    return (sum((i + 3) * t for i, t in enumerate(path)) * 7 + len(path)) % V


def test_a_greedy_tree_emits_what_plain_greedy_decoding_emits():
    rng = np.random.default_rng(1)
    reached_leaf = rejected_all = 0
    for trial in range(400):
        n = int(rng.integers(0, 12))
        parents = random_parents(rng, n)
        root, tokens, paths = int(rng.integers(V)), [], []
        for i in range(n):                                 # most drafts agree with the target: deep paths
            before = paths[parents[i]] if parents[i] >= 0 else [root]
            tokens.append(target_argmax(before) if rng.random() < 0.7 else int(rng.integers(V)))
            paths.append(before + [tokens[i]])
        out = verify_tree_greedy(tokens, parents, [target_argmax(s) for s in [[root]] + paths])
        plain = [root]
        for _ in range(len(out.emitted)):
            plain.append(target_argmax(plain))
        assert out.emitted == plain[1:]
        assert [parents[i] for i in out.path] == ([-1] + out.path)[:-1]      # a path down from the root
        tried = {t.node for ts in out.tries.values() for t in ts}
        assert {i for i, s in enumerate(out.status) if s != "unreached"} == tried
        assert all(out.status[i] == "unreached" for i in range(n) if parents[i] >= 0 and parents[i] not in out.path)
        reached_leaf += out.last_status == "bonus"
        rejected_all += out.last_status == "resampled"
    assert reached_leaf > 50 and rejected_all > 50


def test_on_a_chain_tree_verification_is_verify_bit_for_bit():
    P, Q = markov_pair(2)
    for seed in range(200):
        rng = np.random.default_rng(seed)
        k = int(rng.integers(0, 5))
        tokens, prev = [], 0
        for _ in range(k):
            tokens.append(sample(Q[prev], rng))
            prev = tokens[-1]
        q = Q[([0] + tokens)[:k]].reshape(k, V)
        p = np.array([P[t] for t in [0] + tokens])
        chain = list(range(-1, k - 1))
        expected, residual = verify(tokens, q, p, np.random.default_rng(seed))
        out = verify_tree(tokens, chain, q, p, np.random.default_rng(seed))
        assert out.verdicts == expected
        assert out.emitted == [v.token_id for v in expected if v.status != "rejected"]
        if residual is not None:
            assert (out.last_distribution == residual).all()
        target = [int(np.argmax(row)) for row in p]
        assert verify_tree_greedy(tokens, chain, target).verdicts == verify_greedy(tokens, target, V)[0]


def emitted_law(p, q, k, drawn_without_replacement, rule_without_replacement):
    """The exact law of the token emitted at a node whose k children were drawn from q one way (independently or
    without replacement) and verified by the rule for one way, by enumerating every draw: with the right rule it
    is p, the multi-draft counterpart of verify.first_token_distribution."""
    law = np.zeros(V)

    def tries(residual, drawn, mass):
        if len(drawn) == k:
            law[:] += mass * residual
            return
        drawn_from = without_drawn(q, drawn) if drawn_without_replacement else q
        rule_q = without_drawn(q, drawn) if rule_without_replacement else q
        for x in np.flatnonzero(drawn_from):
            a = acceptance_probability(residual[x], rule_q[x])
            law[x] += mass * drawn_from[x] * a
            if a < 1:
                tries(residual_distribution(residual, rule_q), drawn + [int(x)], mass * drawn_from[x] * (1 - a))

    tries(p, [], 1.0)
    return law


def test_multi_draft_rule_emits_p_exactly():
    """Enumerating every draw of k = 1..4 children: the emitted token's law is p to float precision, for
    children drawn independently, without replacement, or fixed (a top-k with point masses)."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        q[rng.integers(V)] = 0
        q /= q.sum()
        for k in range(1, 5):
            for without in (False, True):
                assert np.abs(emitted_law(p, q, k, without, without) - p).max() <= 1e-12, (k, without)
            law, residual, mass = np.zeros(V), p, 1.0
            for x in np.argsort(-q)[:k]:                  # each child its own point mass: q_i(x_i) = 1
                point = np.eye(V)[x]
                a = acceptance_probability(residual[x], 1.0)
                law[x] += mass * a
                residual, mass = residual_distribution(residual, point), mass * (1 - a)
            assert np.abs(law + mass * residual - p).max() <= 1e-12


def test_children_drawn_without_replacement_need_their_own_rule():
    """The rule for independent children applied to children drawn without replacement is biased, by more
    than the sampled checks below tolerate: those checks can fail."""
    rng = np.random.default_rng(8)
    worst = 0.0
    for _ in range(10):
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        worst = max(worst, 0.5 * np.abs(emitted_law(p, q, 3, True, False) - p).sum())
    assert worst > 3 * np.sqrt(V / N)


class Drafter:
    """Draft trees from the rows Q[previous token], cheaply enough for 200,000 of them."""

    def __init__(self, P, Q):
        self.P, self.Q = P, Q
        self.cdf = np.cumsum(Q, -1).tolist()
        with np.errstate(divide="ignore"):
            self.log_q = np.log(Q)
        self.top = np.argsort(-Q, -1, kind="stable").tolist()

    def tree(self, rng, root, branching, draws="independent"):
        """branching[d] children per node at depth d, drawn from Q[the parent's token] independently, without
        replacement (Gumbel top-k) or as the top-k (their q: point masses).
        -> tokens [n], parents [n], q [n, V], p [n + 1, V]."""
        tokens, parents, frontier = [], [], [(-1, root)]
        for k in branching:
            nxt = []
            for node, prev in frontier:
                if draws == "independent":                             # inverse CDF, as sampling.sample
                    kids = [min(bisect.bisect_right(self.cdf[prev], u), V - 1) for u in rng.random(k).tolist()]
                elif draws == "without_replacement":
                    kids = np.argsort(-(self.log_q[prev] + rng.gumbel(size=V)))[:k].tolist()
                else:
                    kids = self.top[prev][:k]
                for x in kids:
                    parents.append(node)
                    tokens.append(x)
                    nxt.append((len(tokens) - 1, x))
            frontier = nxt
        before = [root if a < 0 else tokens[a] for a in parents]
        q = np.eye(V)[tokens] if draws == "top_k" else self.Q[before]
        return tokens, parents, q.reshape(len(tokens), V), self.P[[root] + tokens]


def decode_rounds(rng, verify_round, n_tokens=2):
    """Decode from the root token 0 until n_tokens are out: one round, or more from the new context.
    -> the tokens, the rounds' verification results."""
    out, rounds = [], []
    while len(out) < n_tokens:
        rounds.append(verify_round(rng, out[-1] if out else 0))
        out += rounds[-1].emitted
    return out[:n_tokens], rounds


def sampled_tvds(verify_round, P, n, seed):
    """TVD of the first token against p(. | 0) and of the first two against p(a | 0) p(b | a); the rounds."""
    rng = np.random.default_rng(seed)
    first, pairs, all_rounds = np.zeros(V), np.zeros(V * V), []
    for _ in range(n):
        (a, b), rounds = decode_rounds(rng, verify_round)
        first[a] += 1
        pairs[a * V + b] += 1
        all_rounds.append(rounds[0])
    return tvd(first, P[0]), tvd(pairs, (P[0][:, None] * P).ravel()), all_rounds


N = 200_000


@pytest.mark.slow
@pytest.mark.parametrize("draws", ["independent", "without_replacement", "top_k"])
def test_tree_verification_samples_the_target_distribution(draws):
    P, Q = markov_pair(4)
    drafter = Drafter(P, Q)

    def tree_round(rng, root):
        tokens, parents, q, p = drafter.tree(rng, root, (3, 2), draws)
        return verify_tree(tokens, parents, q, p, rng, draws == "without_replacement")

    one, two, rounds = sampled_tvds(tree_round, P, N, seed=5)
    assert one <= 3 * np.sqrt(V / N), one
    assert two <= 3 * np.sqrt(V * V / N), two
    depth = np.bincount([r.num_accepted for r in rounds], minlength=3)
    assert depth[1] > 0.05 * N and depth[2] > 0.05 * N          # the second token often comes from depth 2


def exact_block_laws(P, Q, k):
    """Enumerating every chain x_1..x_k drafted from Q after the root token 0: the law of the first two tokens
    [V, V] under block verification (a second token from the next round is p's: the first token's law is
    exact), and the mean accepted length of block and of token-by-token verification."""
    pairs, block, standard = np.zeros((V, V)), 0.0, 0.0
    for draft in itertools.product(range(V), repeat=k):
        prev = [0, *draft]
        q, p = Q[prev[:-1]], P[prev]
        mass = float(np.prod(q[np.arange(k), draft]))
        b, h = block_stop_probabilities(draft, q, p)
        later_fail = 1.0                                   # P(eta_j >= h_j for every j > tau)
        for tau in range(k, -1, -1):
            p_tau = mass * (h[tau] if tau else 1.0) * later_fail
            later_fail *= 1 - h[tau] if tau else 1.0
            block += p_tau * tau
            last = p[k] if tau == k else block_residual(b[tau], p[tau], q[tau])
            if tau >= 2:
                pairs[draft[0], draft[1]] += p_tau
            elif tau == 1:
                pairs[draft[0]] += p_tau * last
            else:
                pairs += p_tau * last[:, None] * P
        accepted = np.cumprod([acceptance_probability(p[i, x], q[i, x]) for i, x in enumerate(draft)])
        standard += mass * accepted.sum()
    return pairs, block, standard


def test_block_verification_is_exact_and_accepts_at_least_as_much():
    gains = []
    for seed in range(12):
        P, Q = markov_pair(seed)
        for k in (1, 2, 3):
            pairs, block, standard = exact_block_laws(P, Q, k)
            assert np.abs(pairs - P[0][:, None] * P).max() <= 1e-12, (seed, k)
            assert block >= standard - 1e-12, (seed, k)
            gains.append(block - standard)
    assert max(gains) > 0.02                               # and strictly more where it can


@pytest.mark.slow
def test_block_verification_samples_the_target_distribution_and_accepts_more():
    """Tolerance for the mean accepted lengths: 3 standard errors of the per-round difference (same draws) and
    4 of the block's own mean against its exact value."""
    P, Q = markov_pair(6)
    drafter = Drafter(P, Q)

    def block_round(rng, root):
        tokens, _, q, p = drafter.tree(rng, root, (1, 1, 1))
        return verify_block(tokens, q, p, rng)

    one, two, rounds = sampled_tvds(block_round, P, N, seed=7)
    assert one <= 3 * np.sqrt(V / N), one
    assert two <= 3 * np.sqrt(V * V / N), two
    block = np.array([r.num_accepted for r in rounds], float)           # the first round of each draw: from 0
    diff = block - [r.standard_num_accepted for r in rounds]
    assert diff.mean() >= -3 * diff.std() / np.sqrt(N)
    _, exact_block, exact_standard = exact_block_laws(P, Q, 3)
    assert abs(block.mean() - exact_block) <= 4 * block.std() / np.sqrt(N)
    assert abs(block.mean() - diff.mean() - exact_standard) <= 4 * block.std() / np.sqrt(N)
