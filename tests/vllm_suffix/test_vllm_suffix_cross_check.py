"""vLLM's suffix decoding (ArcticInference's SuffixDecodingCache, built by `make vllm`), live, against ours: the
same sequence of chat requests, greedy, through one fresh vLLM server and one fresh engine of ours (both global
trees start empty and then hold the same answers), compared step by step: drafted and accepted per step with a
draft (vLLM's `per_step_drafted` / `per_step_accepted`, our rounds).

The tests share the server and the engine, in this order: each test's requests draft from the earlier tests'
answers on both sides, whose trees hold the same tokens until the last test. A folder of its own, collected after tests/e2e/vllm_live, whose three servers are
stopped by then: one vLLM server at a time."""
from __future__ import annotations

import pytest
from ws_client import run

from engine.experiments.workshop import QUESTIONS
from engine.external.openai_stream import stream_chat
from engine.external.vllm_rounds import StepRules
from engine.external.vllm_server import (SUFFIX, VARIANTS, VllmServer, default_venv, suffix_unavailable_reason,
                                         unavailable_reason)
from engine.model.fetched import cache_dir, fetched_models, model_dir
from engine.serving.registry import InferenceEngine, ModelRegistry
from engine.serving.session import GenerationSession

NAME = "smollm2-135m"
GAMMA = SUFFIX["num_speculative_tokens"]
(PHOTOSYNTHESIS, _), (VACCINES, _), (SEASONS, SEASONS_OTHER_WORDS), (BLACK_HOLE, _) = QUESTIONS[:4]
INFLATION = QUESTIONS[8][0]


@pytest.fixture(scope="module")
def both():
    """vLLM with suffix decoding at the variant's settings, and our engine (the settings are the same)."""
    cache = cache_dir()
    venv = default_venv(cache)
    reason = unavailable_reason(venv, model_dir(NAME)) or suffix_unavailable_reason(venv)
    if reason:
        pytest.skip(f"!!! vLLM's suffix decoding SKIPPED: {reason} !!!")
    server = VllmServer(VARIANTS["suffix"], venv, model_dir(NAME), cache / "vllm", rules=StepRules("suffix", GAMMA))
    server.start()
    try:
        assert run(server.wait_ready(timeout_s=540), timeout=560), server.error
        yield server, InferenceEngine(ModelRegistry(fetched_models()), max_sessions=2)
    finally:
        server.stop()


def ours(engine, prompt: str, max_tokens: int) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Our run: emitted ids (EOS included), (drafted, accepted) of the rounds with a draft, and for each of those
    rounds how many output tokens came before it."""
    s = GenerationSession(engine, prompt, {"model": NAME, "chat": True, "temperature": 0, "max_tokens": max_tokens,
                                           **SUFFIX})
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    tokens = [e for e in events if e.type == "token" and e.status != "rejected"]
    rounds = [e for e in events if e.type == "round" and e.num_draft_tokens]
    before = [sum(1 for t in tokens if t.round < r.round) for r in rounds]
    return [t.id for t in tokens], [(r.num_draft_tokens, r.num_accepted) for r in rounds], before


def theirs(server, prompt: str, max_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
    """vLLM's run through our client: its ids and its own per-step lists."""
    async def go():
        async for e in stream_chat(server.engine, prompt, {"temperature": 0, "max_tokens": max_tokens}):
            assert e.type != "error", e.message
            if e.type == "done":
                return e.summary
    summary = run(go(), timeout=300)
    spec = summary["engine_metrics"]["speculative_decoding"]
    return [t["id"] for t in summary["tokens"]], list(zip(spec["per_step_drafted"], spec["per_step_accepted"]))


def vllm_steps(rounds: list[tuple[int, int]], before: list[int], max_tokens: int) -> tuple[list, int]:
    """Where our rounds ran without the max_tokens cap (asked for more tokens): the steps vLLM makes when asked for
    max_tokens (those up to the one that reaches it), and how many tokens its steps sampled (what its trees hold)."""
    for i, ((_, accepted), b) in enumerate(zip(rounds, before)):
        if b >= max_tokens:                              # a round without a draft reached it: one token, no more
            return rounds[:i], max_tokens
        if b + accepted + 1 >= max_tokens:
            return rounds[:i + 1], max(b + accepted + 1, max_tokens)
    return rounds, max_tokens


def test_vllms_trees_keep_what_a_cut_answers_last_step_sampled_past_max_tokens(both):
    """vLLM's proposer adds a step's tokens to its trees before its scheduler cuts the answer at max_tokens: its
    global tree holds the cut answer's last step whole, ours the answer as emitted. Asked again, in the same words
    and in full, vLLM drafts past the cut from that step: ours does so only where its tree holds the same."""
    server, engine = both                                # first in this module: both global trees are empty
    cut = 96
    probe = InferenceEngine(ModelRegistry(fetched_models()), max_sessions=1)   # an empty tree too
    _, rounds, before = ours(probe, VACCINES, cut + GAMMA + 1)
    steps, held = vllm_steps(rounds, before, cut)
    their_ids, their_rounds = theirs(server, VACCINES, cut)
    assert len(their_ids) == cut and their_rounds == steps, (their_rounds, steps)   # vLLM drafts to its last step
    assert held > cut, "this answer's last step was meant to go past max_tokens"
    ours(engine, VACCINES, held)                         # our tree now holds what vLLM's holds
    as_emitted = InferenceEngine(ModelRegistry(fetched_models()), max_sessions=1)
    ours(as_emitted, VACCINES, cut)
    their_ids, their_rounds = theirs(server, VACCINES, 400)
    ids, rounds, _ = ours(engine, VACCINES, 400)
    _, rounds_as_emitted, _ = ours(as_emitted, VACCINES, 400)
    assert ids == their_ids and len(ids) < 400 and rounds == their_rounds, (rounds, their_rounds)
    assert rounds_as_emitted != their_rounds


def test_answers_that_end_by_themselves_draft_and_accept_as_vllm_step_by_step(both):
    """Answers that end at EOS (up to ~120 tokens, max_tokens far above): a question, the same words again
    (drafted from the first answer), other words, and others again. Every step's drafted and accepted counts
    equal vLLM's, and the repeat drafts as long as the trees allow."""
    server, engine = both
    for prompt in (PHOTOSYNTHESIS, PHOTOSYNTHESIS, SEASONS, SEASONS_OTHER_WORDS, SEASONS, BLACK_HOLE, INFLATION,
                   INFLATION):
        ids, rounds, _ = ours(engine, prompt, 256)
        their_ids, their_rounds = theirs(server, prompt, 256)
        assert ids == their_ids and len(ids) < 256, prompt
        assert rounds == their_rounds, f"{prompt!r}: ours {rounds}, vLLM's {their_rounds}"
    # the repeat drafts as long as a tree allows: match + draft <= its depth, draft <= match (factor 1)
    longest = SUFFIX["suffix_decoding_max_tree_depth"] // 2
    assert max(d for d, _ in rounds) == longest and sum(a for _, a in rounds) > len(ids) / 2, rounds


def test_near_max_tokens_we_draft_only_what_can_still_be_emitted_and_vllm_drafts_on(both):
    """The one difference: where max_tokens is near, our rounds draft at most max_tokens - emitted - 1 tokens
    (a round's bonus token takes the last place), and stop drafting at the last token; vLLM's suffix proposer
    drafts up to γ whatever is left (the scheduler drops what is past max_tokens). Before that, every step is
    vLLM's; after it, vLLM's steps draft more or are more."""
    server, engine = both
    max_tokens = 96
    for prompt in (VACCINES, VACCINES):                  # an answer longer than 96 tokens, then again
        ids, rounds, before = ours(engine, prompt, max_tokens)
        their_ids, their_rounds = theirs(server, prompt, max_tokens)
        assert ids == their_ids and len(ids) == max_tokens, prompt
        free = sum(1 for b in before if max_tokens - b - 1 >= GAMMA)     # rounds our cap did not touch
        assert rounds[:free] == their_rounds[:free], f"{prompt!r}: ours {rounds}, vLLM's {their_rounds}"
        capped, their_tail = rounds[free:], their_rounds[free:]
        assert capped != their_tail, f"{prompt!r}: the tail was meant to differ: {capped}"
        assert sum(d for d, _ in capped) < sum(d for d, _ in their_tail), (capped, their_tail)
