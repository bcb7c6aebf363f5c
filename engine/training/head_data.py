"""Self-distillation data for draft heads: a target's own greedy answers to chat prompts, with the
target's last hidden state at every position, written resumably to a folder outside the repository.

    folder/conversations.jsonl   one line per conversation: prompt, kind, ids (prompt + answer), n_prompt
    folder/feats/NNNNN.npy       float16 [len(ids) - 1, C]: hidden state (engine.model.llama.forward's
                                 with_hidden, x / |x|) after each token but the last
    folder/timing.jsonl          one line per batch: kind, prompts, answer tokens, seconds
    folder/topk/NNNNN.npz        with topk = k > 0, instead of feats/: the target's k most probable next tokens
                                 after each token but the last, `ids` int32 [len(ids) - 1, k] and their
                                 probabilities `probs` float16 (softmax at temperature 1), for a draft model's
                                 distillation (engine/training/draft_train.py)

Answers are generated in batches of sequences decoding together (engine.model.llama.forward_batch), the
hidden states taken from the same forwards. A batch is written when it is complete; a rerun skips the
prompts already answered.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..kv.cache import KVCacheManager
from ..model.llama import forward, forward_batch
from .head_prompts import derived_prompt, train_prompts


def answered(folder: Path) -> list[dict]:
    f = folder / "conversations.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.is_file() else []


def top_k(logits, k: int):  # [n, V] -> ids int32 [n, k], probabilities float16 [n, k], most probable first
    ids = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    top = np.take_along_axis(p, ids, -1)
    order = np.argsort(-top, -1)
    return np.take_along_axis(ids, order, -1).astype(np.int32), np.take_along_axis(top, order, -1).astype(np.float16)


def generate_batch(lm, prompts: list[str], max_new: int, block_size: int = 16, topk: int = 0):
    """Greedy answers for `prompts` decoded together -> [(ids, n_prompt, hidden [len(ids) - 1, C])], or with
    topk = k > 0 [(ids, n_prompt, (top ids [len(ids) - 1, k], their probabilities))] (see `top_k`)."""
    model, tok, cfg = lm.model, lm.tokenizer, lm.cfg
    eos = cfg.eos_token_id
    ids = [tok.encode(tok.chat_template.prompt(p)) for p in prompts]
    blocks = sum(-(-(len(x) + max_new + 1) // block_size) for x in ids) + len(ids)
    mgr = KVCacheManager(cfg, blocks, block_size, enable_prefix_caching=False, name="head-data")
    seqs = [mgr.new_sequence() for _ in ids]
    hidden = []
    for x, seq in zip(ids, seqs):
        logits, h = forward(model, np.asarray(x), 0, mgr.append_slots(seq, x), last_only=not topk, with_hidden=True)
        hidden.append([top_k(logits, topk) if topk else h])
        x.append(int(np.argmax(logits[-1])))
    n_prompt = [len(x) - 1 for x in ids]
    active = [i for i in range(len(ids)) if ids[i][-1] != eos]
    while active:
        reqs = [([ids[i][-1]], len(ids[i]) - 1, mgr.append_slots(seqs[i], [ids[i][-1]])) for i in active]
        out = forward_batch(model, reqs, with_hidden=True)
        still = []
        for i, (logits, h) in zip(active, out):
            hidden[i].append(top_k(logits, topk) if topk else h)
            ids[i].append(int(np.argmax(logits[-1])))
            if ids[i][-1] != eos and len(ids[i]) - n_prompt[i] < max_new:
                still.append(i)
        active = still
    if topk:
        return [(x, n, tuple(np.concatenate(part) for part in zip(*h))) for x, n, h in zip(ids, n_prompt, hidden)]
    return [(x, n, np.concatenate(h).astype(np.float16)) for x, n, h in zip(ids, n_prompt, hidden)]


def write_conversations(folder: Path, prompts: list[str], kind: str, lm, max_new: int, batch: int, log,
                        topk: int = 0) -> None:
    done = {c["prompt"] for c in answered(folder)}
    todo = [p for p in prompts if p not in done]
    (folder / ("topk" if topk else "feats")).mkdir(parents=True, exist_ok=True)
    n_done = len(done)
    for b in range(0, len(todo), batch):
        t = time.time()
        results = generate_batch(lm, todo[b:b + batch], max_new, topk=topk)
        lines = []
        for p, (ids, n_prompt, h) in zip(todo[b:b + batch], results):
            if topk:
                np.savez(folder / "topk" / f"{n_done:05d}.npz", ids=h[0], probs=h[1])
            else:
                np.save(folder / "feats" / f"{n_done:05d}.npy", h)
            lines.append(json.dumps({"index": n_done, "prompt": p, "kind": kind, "ids": ids, "n_prompt": n_prompt}))
            n_done += 1
        with open(folder / "conversations.jsonl", "a") as f:
            f.write("\n".join(lines) + "\n")
        n_tok, seconds = sum(len(r[0]) - r[1] for r in results), time.time() - t
        with open(folder / "timing.jsonl", "a") as f:          # the generation time the model card states
            f.write(json.dumps({"kind": kind, "prompts": len(results), "answer_tokens": n_tok, "s": round(seconds, 1)}) + "\n")
        log(f"{kind}: {min(b + batch, len(todo))}/{len(todo)} prompts, {n_tok} answer tokens in {seconds:.1f} s")


def own_texts(conversations: list[dict], tokenizer) -> list[str]:
    """The model's own longer prose answers (paragraphs and explanations, no code), in the order answered."""
    return [tokenizer.decode(c["ids"][c["n_prompt"] + 1:]).replace("<|im_end|>", "")
            for c in conversations if c["kind"] == "open" and len(c["ids"]) - c["n_prompt"] > 80
            and "Python" not in c["prompt"]]


def build(folder: str | Path, lm, batch: int = 32, max_new: int = 160, n_open: int = 576, derived_every: int = 3,
          round_size: int = 256, prompts: list[str] | None = None, log=print, topk: int = 0) -> None:
    """`n_open` of the training prompts (a fixed shuffle, so every kind is in), in rounds of `round_size`; after
    each round, a summary or rewrite (head_prompts.derived_prompt) of every `derived_every`-th of the model's
    own prose answers so far. Resumable: answered prompts are skipped. topk > 0: the target's top-k next-token
    distributions are stored instead of its hidden states (see the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prompts = prompts if prompts is not None else train_prompts()
    prompts = [prompts[i] for i in np.random.default_rng(0).permutation(len(prompts))[:n_open]]
    for r in range(0, len(prompts), round_size):
        write_conversations(folder, prompts[r:r + round_size], "open", lm, max_new, batch, log, topk)
        texts = own_texts(answered(folder), lm.tokenizer)
        derived = [derived_prompt(t, i // derived_every) for i, t in enumerate(texts) if i % derived_every == 0]
        write_conversations(folder, derived, "summary", lm, 96, batch, log, topk)
    log("done")
