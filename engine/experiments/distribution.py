"""The first seed's experiment, as a job (engine/serving/jobs.py): does speculative sampling reproduce the
target's distribution?

    distribution_steps(engine, prompt, samples, temperature, seed)   -> TVDs against p, acceptance, theory

From `prompt`, one round is drafted and verified `samples` times, and the round's first emitted token is counted.
Rejection sampling is exact when that token is distributed as p, the target's distribution after the prompt:
its total variation distance (TVD) from p then stays at the sampling noise, which direct sampling from p shows
beside it (and sampling from the draft's q alone does not). A round drafts γ tokens (`num_speculative_tokens`)
and is verified by the `standard` rule or the `block` rule (engine/spec_decode/verify.py). With one draft token
the two rules are the same; with more, the block rule's first token depends on the later drafts' p and q too,
which is what makes the check a test of it.

Tree mode (`tree_distribution_steps`): a round drafts a token tree instead (engine/spec_decode/eagle_tree.py,
medusa_tree.py, ngram.py), verified by SpecInfer's recursive rejection sampling (tree_verify.py), and the first
emitted token is counted the same way. The tree is drafted after the prompt by the proposer of a session that has
run its prefill (an EAGLE head's tree, Medusa's heads' or n-gram lookup's), anew for every sample: a drawn child
whose presence in the tree depended on its token would bias the count, so the whole tree is drawn each time.

The job yields between slices of samples, and times them on the engine thread's CPU clock.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..kv.runner import ROUND_BOUNDARY, ForwardRequest
from ..model.llama import forward_no_cache
from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.session import GenerationSession
from ..serving.settings import GenerationSettings, SettingsError
from ..spec_decode.draft import DraftParams
from ..spec_decode.eagle_tree import draft_tree
from ..spec_decode.sampling import probs_from_logits, sample
from ..spec_decode.tree_verify import verify_tree_draft
from ..spec_decode.verify import verify, verify_block

DISTRIBUTION_SLICE = 500                # samples a step of the distribution check


def tvd(counts, p) -> float:
    """Total variation distance between the empirical distribution of `counts` and p."""
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def binomial_mean_absolute_deviation(n: int, p: float) -> float:
    """E|X - n p| for X ~ Binomial(n, p), exactly (de Moivre): 2 v C(n, v) p^v (1 - p)^(n - v + 1), v = floor(n p) + 1.
    A large vocabulary's rare tokens are far from the normal approximation sqrt(2 n p (1 - p) / pi): about 2 n p."""
    if not 0 < p < 1:
        return 0.0
    v = math.floor(n * p) + 1
    log_term = (math.lgamma(n + 1) - math.lgamma(v + 1) - math.lgamma(n - v + 1) + v * math.log(p)
                + (n - v + 1) * math.log1p(-p))
    return 2 * v * math.exp(log_term)


def tvd_noise(p, samples: int) -> float:
    """The TVD's expected value at the sampling noise for `samples` draws from p: 0.5 sum_x E|count(x) / N - p(x)|."""
    return 0.5 * sum(binomial_mean_absolute_deviation(samples, float(px)) for px in p[p > 0]) / samples


class ChainLaws:
    """The target's p and the draft's q after the prompt and a drafted continuation, each computed once: a check
    draws many chains, and a character model's few likely continuations repeat."""

    def __init__(self, target, draft, ids: list[int], temperature: float):
        self.target, self.draft, self.ids, self.temperature = target, draft, ids, temperature
        self._q: dict[tuple, np.ndarray] = {}
        self._p: dict[tuple, np.ndarray] = {}

    def q(self, chain: tuple):  # -> [V] the draft's distribution after prompt + chain
        if chain not in self._q:
            logits = forward_no_cache(self.draft.model, self.ids + list(chain))[-1]
            self._q[chain] = probs_from_logits(logits, self.temperature)
        return self._q[chain]

    def p(self, chain: tuple):  # -> [len(chain) + 1, V] the target's after the prompt and after each drafted token
        if chain not in self._p:
            logits = forward_no_cache(self.target.model, self.ids + list(chain))[len(self.ids) - 1:]
            self._p[chain] = probs_from_logits(logits, self.temperature)
        return self._p[chain]


def distribution_steps(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                       progress=None, rejection_sample_method: str = "standard",
                       num_speculative_tokens: int = 1) -> Job[dict]:
    """`samples` rounds of γ = `num_speculative_tokens` draft tokens from `prompt`, each verified by the rule,
    against direct sampling from p and draft-only sampling from q, each compared with p by TVD. `progress(i, n)`
    is told how far it is after every slice."""
    if temperature <= 0:
        raise SettingsError("temperature", "the distribution check needs temperature > 0")
    asked = GenerationSettings.parse({"rejection_sample_method": rejection_sample_method,     # errors name them
                                      "num_speculative_tokens": num_speculative_tokens})
    rule, k = asked.rejection_sample_method, asked.num_speculative_tokens
    target = engine.registry.default_target()
    draft = engine.registry.draft_for(target)
    ids = target.tokenizer.encode(prompt)
    laws = ChainLaws(target, draft, ids, temperature)
    p, q = laws.p(())[0], laws.q(())
    rng = np.random.default_rng(seed)
    V = len(p)
    spec, first_accepted, accepted, standard_accepted = np.zeros(V), 0, 0, 0
    seconds = 0.0
    every = max(1, samples // 20)
    for i in range(samples):
        if i % DISTRIBUTION_SLICE == 0:
            yield
            t = time.thread_time()
        chain, qs = (), []
        for _ in range(k):                                 # the draft: each token from q after the ones before it
            qs.append(laws.q(chain))
            chain += (sample(qs[-1], rng),)
        rows = laws.p(chain[:-1])                          # [k, V] p after the prompt and after x_1..x_{k-1}
        # the bonus row, p after x_k, is only drawn from after all k are accepted, so never for the first token:
        # its stand-in saves a forward per chain
        p_rows = np.concatenate([rows, rows[-1:]])
        if rule == "block":
            block = verify_block(list(chain), np.array(qs), p_rows, rng)
            verdicts, n = block.verdicts, block.num_accepted
            standard_accepted += block.standard_num_accepted
        else:
            verdicts, _ = verify(list(chain), np.array(qs), p_rows, rng)
            n = sum(v.status == "accepted" for v in verdicts)
        spec[next(v.token_id for v in verdicts if v.status != "rejected")] += 1     # x_1, or its replacement
        first_accepted += verdicts[0].status == "accepted"
        accepted += n
        if progress and ((i + 1) % every == 0 or i + 1 == samples):
            progress(i + 1, samples)
        if (i + 1) % DISTRIBUTION_SLICE == 0 or i + 1 == samples:
            seconds += time.thread_time() - t
    yield
    t = time.thread_time()
    direct = np.bincount(rng.choice(V, size=samples, p=p), minlength=V).astype(float)
    draft_only = np.bincount(rng.choice(V, size=samples, p=q), minlength=V).astype(float)
    seconds += time.thread_time() - t
    top = np.argsort(-p)[:8]
    tok = target.tokenizer
    return {"prompt": prompt, "samples": samples, "temperature": temperature, "seed": seed,
            "target": target.name, "draft": draft.name, "rejection_sample_method": rule, "num_speculative_tokens": k,
            # how often x_1 was accepted: in theory sum(min(p, q)) for the standard rule
            "acceptance_rate": first_accepted / samples, "theory_sum_min_p_q": float(np.minimum(p, q).sum()),
            "mean_acceptance_length": 1 + accepted / samples,
            # block: token-by-token verification of the same drafts with the same draws
            "standard_mean_acceptance_length": 1 + standard_accepted / samples if rule == "block" else None,
            "tvd_speculative": tvd(spec, p), "tvd_direct": tvd(direct, p), "tvd_draft_only": tvd(draft_only, p),
            "seconds": seconds,
            "top_tokens": [{"text": tok.token_text(int(i)), "p": float(p[i]), "q": float(q[i]),
                            "speculative": float(spec[i] / samples), "direct": float(direct[i] / samples),
                            "draft_only": float(draft_only[i] / samples)} for i in top]}


def check_distribution(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                       progress=None, rejection_sample_method: str = "standard", num_speculative_tokens: int = 1) -> dict:
    return run_to_end(distribution_steps(engine, prompt, samples, temperature, seed, progress,
                                         rejection_sample_method, num_speculative_tokens))


def drive(steps):
    """Run a proposer's generator to its end, each ForwardRequest it yields run at once; its return value."""
    logits = None
    try:
        while True:
            logits = steps.send(logits).run()
    except StopIteration as stop:
        return stop.value


def tree_distribution_steps(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                            progress=None, settings: dict | None = None) -> Job[dict]:
    """`samples` token trees drafted after the prompt (a session's prefill holds its K/V and features) by the
    proposer of `settings` (a model, a method that drafts trees, num_speculative_tokens as the depth,
    speculative_eagle_topk, speculative_num_draft_tokens; errors name them), each verified against p at the root, beside
    direct sampling from p. The first emitted token is decided at the root, before any node's own row of p is
    read: the root's row stands in for the others, which saves a target forward per tree."""
    if temperature <= 0:
        raise SettingsError("temperature", "the distribution check needs temperature > 0")
    asked = {"method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 4,
             "speculative_num_draft_tokens": 8, **(settings or {}), "temperature": temperature, "seed": seed}
    session = GenerationSession(engine, prompt, asked)
    if not session.settings.drafts_tree:
        raise SettingsError("speculative_eagle_topk", "must be above 1 for the tree check (1 is a chain)")
    steps, item = session.steps(), None
    try:
        while item is not ROUND_BOUNDARY:                   # the prefill: the prompt's K/V and features
            item = steps.send(item.run() if isinstance(item, ForwardRequest) else None)
        tokens, proposer, s = session.tokens[:len(session.prompt_ids)], session.proposer, session.settings
        session.target.truncate(len(tokens) - 1)            # as at a round's start, drafting after the prompt
        root = session.target.extend([tokens[-1]])[-1]      # the target's logits after the prompt [V]
        session.target.truncate(len(tokens) - 1)
        p = probs_from_logits(root, temperature)
        params = DraftParams.of(s, s.num_speculative_tokens, s.num_draft_tokens)
        rng = np.random.default_rng(seed)
        if proposer.method == "eagle":                      # its catch-up once; each tree from its root
            root_logits = drive(proposer.catch_up(tokens))
            caught_up = proposer.runner.hidden

            def draw():
                proposer.runner.hidden = caught_up           # the root's predicted feature, as after the catch-up
                return drive(draft_tree(proposer, root_logits, params, rng))
        else:
            def draw():
                return drive(proposer.propose(tokens, params, rng))
        V = len(p)
        spec, first_accepted, seconds, nodes, q_root = np.zeros(V), 0, 0.0, 0, None
        every = max(1, samples // 20)
        for i in range(samples):
            if i % DISTRIBUTION_SLICE == 0:
                yield
                t = time.thread_time()
            draft = draw()
            verification = verify_tree_draft(draft, np.repeat(root[None], len(draft) + 1, axis=0), temperature, 1.0,
                                             rng)
            spec[verification.tree.emitted[0]] += 1
            first_accepted += bool(verification.tree.path)
            nodes += len(draft)
            if q_root is None and len(draft):
                q_root = draft.q[0]                          # the drafter's q at the root (its first child's)
            if progress and ((i + 1) % every == 0 or i + 1 == samples):
                progress(i + 1, samples)
            if (i + 1) % DISTRIBUTION_SLICE == 0 or i + 1 == samples:
                seconds += time.thread_time() - t
    finally:
        steps.close()                                      # the session's blocks go back to the pool
    direct = np.bincount(rng.choice(V, size=samples, p=p), minlength=V).astype(float)
    top = np.argsort(-p)[:8]
    tok = session.tokenizer
    return {"prompt": prompt, "samples": samples, "temperature": temperature, "seed": seed, "tree": True,
            "target": session.target_lm.name, "method": s.method, "num_speculative_tokens": s.num_speculative_tokens,
            "speculative_eagle_topk": s.speculative_eagle_topk, "speculative_num_draft_tokens": s.num_draft_tokens,
            "mean_tree_nodes": nodes / samples,
            "acceptance_rate": first_accepted / samples,      # how often a child of the root was accepted
            "tvd_speculative": tvd(spec, p), "tvd_direct": tvd(direct, p), "tvd_noise": tvd_noise(p, samples),
            "tvd_draft_only": None if q_root is None else 0.5 * float(np.abs(q_root - p).sum()),
            "seconds": seconds,
            "top_tokens": [{"text": tok.token_text(int(i)), "p": float(p[i]),
                            "speculative": float(spec[i] / samples), "direct": float(direct[i] / samples)}
                           for i in top]}


def check_tree_distribution(engine: InferenceEngine, prompt: str, samples: int, temperature: float, seed: int,
                            progress=None, settings: dict | None = None) -> dict:
    return run_to_end(tree_distribution_steps(engine, prompt, samples, temperature, seed, progress, settings))
