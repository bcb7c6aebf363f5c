"""The token inspector's figures (engine/spec_decode/inspector.py): p(x), q(x) and the top-5 lists equal those of a float64
softmax and a full sort, whether a round hands over logits (greedy) or distributions (sampling)."""
import numpy as np

from engine.serving.events import TokenResult
from engine.spec_decode.inspector import Inspector, Unshown


class Tokens:
    def token_text(self, i: int) -> str:
        return f"<{i}>"


def annotate(unshown: Unshown) -> None:
    inspector = Inspector(Tokens())
    inspector.unshown.append(unshown)
    inspector.annotate()
    assert inspector.unshown == []            # each round's events are annotated once


def softmax64(x):
    z = np.asarray(x, np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def round_of(ids, statuses):
    return [TokenResult(1, i + 1, x, "", s, None, None, None, None) for i, (x, s) in enumerate(zip(ids, statuses))]


def check(events, p, q):  # p [n, V], q [n - 1, V] probabilities
    for e in events:
        i = e.position - 1
        assert abs(e.p - p[i, e.id]) <= 1e-6 * max(p[i, e.id], 1e-30) + 1e-12
        top = np.argsort(-p[i], kind="stable")[:5]
        assert [t[0] for t in e.top_p] == top.tolist()
        np.testing.assert_allclose([t[2] for t in e.top_p], p[i, top], rtol=1e-6)
        assert e.top_p[0][1] == f"<{top[0]}>"
        if i < len(q):
            assert [t[0] for t in e.top_q] == np.argsort(-q[i], kind="stable")[:5].tolist()
            if e.status != "bonus":
                assert abs(e.q - q[i, e.id]) <= 1e-6 * max(q[i, e.id], 1e-30) + 1e-12


def test_greedy_figures_from_logits_equal_a_float64_softmax():
    rng = np.random.default_rng(0)
    V, subset = 5000, np.sort(rng.choice(5000, 300, replace=False))
    p_logits = (3 * rng.standard_normal((4, V))).astype(np.float32)
    q_logits = np.full((3, V), -np.inf, np.float32)                 # a head's q: zero outside its subset
    q_logits[:, subset] = 3 * rng.standard_normal((3, len(subset)))
    ids = [int(subset[5]), int(subset[9]), 17, 23]
    events = round_of(ids, ["accepted", "accepted", "rejected", "bonus"])
    annotate(Unshown(events, p_logits, True, q_logits, True, None))
    p, q = softmax64(p_logits), softmax64(q_logits)
    check(events, p, q)
    assert events[2].q == 0.0 and all(t[0] in set(subset.tolist()) for t in events[0].top_q)


def test_sampled_figures_from_distributions_are_read_as_given():
    rng = np.random.default_rng(1)
    p, q = softmax64(rng.standard_normal((3, 800))), softmax64(rng.standard_normal((2, 800)))
    events = round_of([3, 4, 5], ["accepted", "resampled", "target"])
    residual = np.maximum(p[1] - q[1], 0)
    residual /= residual.sum()
    annotate(Unshown(events, p, False, q, False, residual))
    check(events, p, q)
    assert [t[0] for t in events[1].residual_top] == np.argsort(-residual, kind="stable")[:5].tolist()


def test_a_greedy_replacement_shows_no_residual_and_a_sampled_one_does():
    """At temperature 0 the target's argmax replaces a rejected draft token: nothing is drawn, so there is no
    residual to show (verify_greedy's is the point mass on the argmax). Sampling draws from the residual."""
    rng = np.random.default_rng(2)
    p_logits = rng.standard_normal((2, 300)).astype(np.float32)
    q_logits = rng.standard_normal((1, 300)).astype(np.float32)
    target = int(p_logits[0].argmax())
    residual = np.zeros(300)
    residual[target] = 1.0

    def replaced():
        return [TokenResult(1, 1, target + 1, "", "rejected", None, None, 0.0, None),
                TokenResult(1, 1, target, "", "resampled", None, None, None, None)]

    greedy = replaced()
    annotate(Unshown(greedy, p_logits, True, q_logits, True, residual))
    assert greedy[1].residual_top == [] and greedy[1].p > 0
    sampled = replaced()
    annotate(Unshown(sampled, softmax64(p_logits), False, softmax64(q_logits), False, residual))
    assert sampled[1].residual_top[0] == [target, f"<{target}>", 1.0]
