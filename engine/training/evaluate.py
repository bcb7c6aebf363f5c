"""How well a draft agrees with a target at temperature 0, measured on held-out text.

Two numbers, both on the validation split (files the models never trained on):
- `acceptance_rate`: run speculative greedy decoding (draft proposes k tokens greedily, the target
  verifies them in one forward; accept while they equal the target's argmax, then take the target's
  token) from prompts cut from the validation text; accepted / proposed (vLLM's definition). `alpha`
  counts only proposals the target judged: accepted / (accepted + rejected), Leviathan et al.'s
  per-token acceptance (the seed article's figure). `mean_acceptance_length`
  is the mean number of tokens emitted per target forward (accepted + 1).
- `top1_agreement`: teacher-forced, the fraction of positions of validation windows where
  argmax(draft) == argmax(target).
- `draft_cost`: c, the time of one draft decode step over one target decode step (KV cache, a
  100-token context), the other number the speed-up of speculative decoding depends on.
Uses the engine's inference forward (`engine.model.llama.forward_no_cache`), so it measures what ships.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..kv.cache import KVCacheManager
from ..model.llama import Model, forward, forward_no_cache


def speculative_greedy(target: Model, draft: Model, prompt, max_tokens=128, k=4):
    """-> (generated tokens, proposed, accepted, target forwards, rejected)."""
    seq = list(prompt)
    proposed = accepted = rounds = rejected = 0
    while len(seq) - len(prompt) < max_tokens:
        kk = min(k, max_tokens - (len(seq) - len(prompt)))
        props = []
        for _ in range(kk):  # the draft proposes greedily
            props.append(int(np.argmax(forward_no_cache(draft, seq + props)[-1])))
        logits = forward_no_cache(target, seq + props)[len(seq) - 1:]  # [kk + 1, V]: one verification
        best = logits.argmax(-1)
        n = 0
        while n < kk and props[n] == best[n]:
            n += 1
        seq += props[:n] + [int(best[n])]  # accepted tokens, then the target's correction or bonus token
        proposed, accepted, rounds, rejected = proposed + kk, accepted + n, rounds + 1, rejected + (n < kk)
    return seq[len(prompt):], proposed, accepted, rounds, rejected


def acceptance(target: Model, draft: Model, val_ids, n_prompts=16, prompt_len=64, max_tokens=128, k=4):
    starts = np.linspace(0, len(val_ids) - prompt_len - 1, n_prompts).astype(int)
    proposed = accepted = rounds = emitted = rejected = 0
    for s in starts:
        out, p, a, r, j = speculative_greedy(target, draft, [int(t) for t in val_ids[s:s + prompt_len]], max_tokens, k)
        proposed, accepted, rounds, emitted, rejected = proposed + p, accepted + a, rounds + r, emitted + len(out), rejected + j
    return dict(acceptance_rate=round(accepted / proposed, 4), alpha=round(accepted / max(1, accepted + rejected), 4),
                mean_acceptance_length=round(emitted / rounds, 3),
                num_speculative_tokens=k, prompts=n_prompts, prompt_len=prompt_len, max_tokens=max_tokens)


def top1_agreement(target: Model, draft: Model, val_ids, n_windows=16, window=512):
    starts = np.linspace(0, len(val_ids) - window - 1, n_windows).astype(int)
    same = total = 0
    for s in starts:
        w = val_ids[s:s + window].astype(np.int64)
        same += int((forward_no_cache(target, w).argmax(-1) == forward_no_cache(draft, w).argmax(-1)).sum())
        total += window
    return round(same / total, 4)


def draft_cost(target: Model, draft: Model, context=100, repeats=15, steps=20) -> dict:
    """Median ms of one decode step of each model at `context` tokens (the step rolled back so that every
    repeat is the same), the two interleaved so that machine noise falls on both; c = draft / target."""
    ids = np.random.default_rng(0).integers(2, min(target.cfg.vocab_size, draft.cfg.vocab_size), context + 1)
    loops = []
    for m in (target, draft):
        mgr = KVCacheManager(m.cfg, num_blocks=context // 16 + 2, block_size=16)
        seq = mgr.new_sequence()
        forward(m, ids[:context], 0, mgr.append_slots(seq, ids[:context]))

        def loop(m=m, mgr=mgr, seq=seq):
            for _ in range(steps):
                forward(m, ids[context:], context, mgr.append_slots(seq, ids[context:]))
                mgr.truncate(seq, context)
        loops.append(loop)
    times = [[], []]
    for _ in range(repeats):
        for i, loop in enumerate(loops):
            loop()                                   # warm: as in a decode loop, weights in the CPU caches
            t = time.perf_counter()
            loop()
            times[i].append((time.perf_counter() - t) / steps * 1e3)
    target_ms, draft_ms = (statistics.median(t) for t in times)
    return dict(target_step_ms=target_ms, draft_step_ms=draft_ms, c=draft_ms / target_ms, context=context)
