"""The acceptance measurement runs real speculative greedy decoding: its output equals plain greedy
decoding of the target, whatever the draft proposes."""
import numpy as np

from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model, forward_no_cache
from engine.training.evaluate import acceptance, draft_cost, speculative_greedy


def test_speculative_greedy_equals_target_greedy():
    cfg = ModelConfig.from_name("ci-tiny")
    target = Model(cfg, init_weights(cfg, seed=1, std=0.5))
    draft = Model(cfg, init_weights(cfg, seed=2, std=0.5))
    prompt = [5, 6, 7, 8]
    out, proposed, accepted, rounds, rejected = speculative_greedy(target, draft, prompt, max_tokens=20, k=3)
    seq = list(prompt)
    for _ in range(20):
        seq.append(int(np.argmax(forward_no_cache(target, seq)[-1])))
    assert out[:20] == seq[len(prompt):]
    assert 0 <= accepted <= proposed and rounds >= 20 / 4
    # a draft identical to the target is always accepted
    _, p, a, _, j = speculative_greedy(target, target, prompt, max_tokens=12, k=3)
    assert a == p and j == 0


def test_acceptance_report_fields():
    cfg = ModelConfig.from_name("ci-tiny")
    m = Model(cfg, init_weights(cfg, seed=1, std=0.5))
    r = acceptance(m, m, np.arange(200) % 50, n_prompts=2, prompt_len=8, max_tokens=10, k=4)
    assert r["acceptance_rate"] == 1.0 and r["mean_acceptance_length"] == 5.0  # 4 accepted + 1 bonus per target forward


def test_draft_cost_is_the_ratio_of_the_two_decode_steps():
    cfg = ModelConfig.from_name("ci-tiny")
    m = Model(cfg, init_weights(cfg, seed=1, std=0.5))
    r = draft_cost(m, m, context=20, repeats=3, steps=2)
    assert r["target_step_ms"] > 0 and r["draft_step_ms"] > 0 and r["context"] == 20
    assert r["c"] == r["draft_step_ms"] / r["target_step_ms"]
