"""SmolLM2's draft in vLLM's draft-model layout (engine/training/vllm_draft_export.py): read back by our checkpoint
code, its full-vocabulary head drafts greedily what our engine's draft (subset S plus the context's tokens) does,
on the heads' held-out questions, except where ours drafts a context token outside S (which no fixed head can)."""
import json

import numpy as np
import pytest

from cli.bench.heads import OPEN as OPEN_QUESTIONS
from engine.kv.runner import RecomputeRunner
from engine.model.checkpoint import load_checkpoint
from engine.model.llama import Model, forward
from engine.model.shipped_drafts import DRAFTS_DIR, load_draft
from engine.spec_decode.draft import DraftParams
from engine.spec_decode.subset_draft import draft_model_proposer
from engine.training.vllm_draft_export import TOKENIZER_FILES, export_draft_for_vllm

NAME = "smollm2-135m"
CHAIN = 40                   # greedy drafts per question: the draft's own continuation


@pytest.fixture(scope="module")
def exported(smollm2_dir, tmp_path_factory):
    return export_draft_for_vllm(NAME, tmp_path_factory.mktemp("vllm-draft") / NAME, cache=smollm2_dir.parents[1])


def our_chain(draft, tokenizer, prompt: str) -> tuple[list[int], list[int]]:
    """The chat prompt's ids and our engine's greedy drafts after it (its proposer, S plus the context's tokens)."""
    ids = tokenizer.encode(tokenizer.chat_template.prompt(prompt))
    gen = draft_model_proposer(RecomputeRunner(draft)).propose(ids, DraftParams(CHAIN, 0.0), np.random.default_rng(0))
    request = next(gen)
    try:
        while True:
            request = gen.send(request.run())
    except StopIteration as stop:
        return ids, [int(t) for t in stop.value.tokens]


def test_the_export_is_a_llama_checkpoint_with_the_targets_tokenizer(exported, smollm2_dir):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is False and config["torch_dtype"] == "float32"
    for name in TOKENIZER_FILES:
        assert (exported / name).read_bytes() == (smollm2_dir / name).read_bytes()
    stamp = (exported / "model.safetensors").stat().st_mtime_ns
    assert export_draft_for_vllm(NAME, exported, cache=smollm2_dir.parents[1]) == exported
    assert (exported / "model.safetensors").stat().st_mtime_ns == stamp          # the same draft: kept, not rewritten


def test_its_greedy_drafts_are_ours_except_a_context_token_outside_the_subset(exported, smollm2_dir):
    """Over S the exported logits are ours; outside S they are 0, below the best of S at every position by a
    margin; so the argmax is ours wherever ours is in S, and every difference is a context token outside S."""
    from engine.model.tokenizer import TextTokenizer
    tokenizer = TextTokenizer.from_file(smollm2_dir / "tokenizer.json")
    ours = load_draft(DRAFTS_DIR / NAME)
    cfg, weights, _ = load_checkpoint(exported, with_tokenizer=False)
    theirs = Model(cfg, weights)
    subset = ours.lm_head_ids
    outside = np.ones(cfg.vocab_size, bool)
    outside[subset] = False
    positions, differ, margin = 0, [], np.inf
    for prompt in OPEN_QUESTIONS:
        ids, chain = our_chain(ours, tokenizer, prompt)
        logits = forward(theirs, np.array(ids + chain[:-1]), 0, None)[len(ids) - 1:]     # [CHAIN, V]: before each draft
        subset_logits = forward(ours, np.array(ids + chain[:-1]), 0, None)[len(ids) - 1:]
        np.testing.assert_allclose(logits[:, subset], subset_logits, rtol=1e-4, atol=1e-4)
        assert (logits[:, outside] == 0).all()
        margin = min(margin, float(logits[:, subset].max(-1).min()))
        for j, (picked, ours_token) in enumerate(zip(logits.argmax(-1), chain)):
            positions += 1
            if picked != ours_token:
                assert outside[ours_token] and ours_token in ids + chain[:j], (prompt, j, picked, ours_token)
                differ.append((prompt, j, ours_token))
    assert margin > 1.0, f"a subset logit came within {margin:.3f} of the zero rows"
    assert positions == CHAIN * len(OPEN_QUESTIONS) and len(differ) <= positions // 20, differ
    print(f"{positions - len(differ)} of {positions} greedy drafts equal; the rest context tokens outside S: "
          f"{differ}; the best subset logit at least {margin:.2f} (the zero rows' 0)")
