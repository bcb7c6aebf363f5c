"""Choosing a draft model's shape for a target by measurement: c, a draft decode step over a target decode step.

Leviathan et al.'s speed-up for a chain of γ drafts is (1 - α^(γ+1)) / ((1 - α)(γ c + t(γ+1)/t(1))): the
draft only pays while c is small. On a CPU the target's step is a pass over its weights (memory-bound),
while a small draft's step is mostly numpy's per-call overhead plus its LM head, so c is measured, not
estimated from parameter counts.

Each candidate is a Llama decoder (engine.model.llama.Model) with random weights of its config, run by the
engine's own forward against its own paged KV cache at a fixed context length. Rounds are interleaved as
speculative decoding runs them: a target decode step, then γ draft steps in a row (the draft's weights
warm after the first). A round's c for a candidate is the median of its γ steps over the median of the
round's target steps; a machine shared with other work makes single rounds noisy (a step that loses the
core shows as a spike), so the table gives the median over rounds and their spread.

NOTE: under load the target's step (a pass over its weights, with other processes reading memory too)
slows more than a small draft's, so c measured on a busy machine reads low; compare candidates within one
run, and check the chosen one on a quiet machine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..kv.cache import KVCacheManager
from ..model.checkpoint import init_weights
from ..model.config import ModelConfig
from ..model.llama import Model, forward

HEAD_DIM = 64                # SmolLM2's; draft widths are multiples of it


@dataclass(frozen=True)
class DraftShape:
    """A candidate draft: layers x width, its heads, and the rows of its LM head."""
    num_hidden_layers: int
    hidden_size: int
    num_key_value_heads: int
    lm_head_rows: int        # the full vocabulary, or a frequent-token subset plus the context's tokens

    @property
    def num_attention_heads(self) -> int:
        return self.hidden_size // HEAD_DIM

    @property
    def intermediate_size(self) -> int:   # SmolLM2's MLP ratio (1536 / 576 = 8/3), in multiples of 64
        return max(64, round(self.hidden_size * 8 / 3 / 64) * 64)

    def config(self, target: ModelConfig, vocab_size: int | None = None) -> ModelConfig:
        return ModelConfig(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           intermediate_size=self.intermediate_size, vocab_size=vocab_size or self.lm_head_rows,
                           max_position_embeddings=target.max_position_embeddings, head_dim=HEAD_DIM,
                           rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
                           tie_word_embeddings=False, bos_token_id=target.bos_token_id,
                           eos_token_id=target.eos_token_id, name="draft-candidate")

    def label(self, target_vocab: int) -> str:
        head = "full" if self.lm_head_rows == target_vocab else f"{self.lm_head_rows:,}"
        return (f"{self.num_hidden_layers} x {self.hidden_size}, {self.num_attention_heads}/{self.num_key_value_heads} "
                f"heads, MLP {self.intermediate_size}, LM head {head}")


def kv_heads_for(hidden: int) -> int:
    """GQA as in SmolLM2 (3 query heads per KV head) where the head count allows it, else 2, else MQA."""
    q = hidden // HEAD_DIM
    return next((q // g for g in (3, 2) if q % g == 0 and q // g >= 1 and g < q), 1)


def candidates(target_vocab: int, subset_rows: tuple[int, ...] = (4096 + 256, 8192 + 256),
               widths=(128, 192, 256, 384, 576), layers=(1, 2, 4)) -> list[DraftShape]:
    """Every width x depth with each LM head: frequent-token subsets (plus 256 context tokens) and the full one."""
    return [DraftShape(n, h, kv_heads_for(h), rows) for n in layers for h in widths
            for rows in (*subset_rows, target_vocab)]


class _Stepper:
    """One model decoding one token at a fixed position: append, forward, roll back (its cache holds `context`)."""

    def __init__(self, model, cfg: ModelConfig, context: int, rng):
        self.model, self.token = model, int(rng.integers(cfg.vocab_size))
        self.mgr = KVCacheManager(cfg, -(-(context + 1) // 16) + 1, 16, enable_prefix_caching=False, name=cfg.name)
        self.seq = self.mgr.new_sequence()
        ids = rng.integers(0, cfg.vocab_size, context)
        forward(model, ids, 0, self.mgr.append_slots(self.seq, ids), last_only=True)
        self.context = context

    def step(self) -> float:  # -> seconds of one decode step (the token's forward and its logits)
        t = time.perf_counter()
        forward(self.model, np.array([self.token]), self.context, self.mgr.append_slots(self.seq, [self.token]))
        dt = time.perf_counter() - t
        self.mgr.truncate(self.seq, self.context)
        return dt


def measure_c(target_model, target_cfg: ModelConfig, shapes: list[DraftShape], context: int = 256,
              rounds: int = 12, gamma: int = 4, seed: int = 0, log=print) -> list[dict]:
    """c per candidate, interleaved with the target's decode steps (see the module docstring) -> one row per shape:
    the shape, its parameters, its draft step in ms (median), c's median over rounds and its min / max."""
    rng = np.random.default_rng(seed)
    target = _Stepper(target_model, target_cfg, context, rng)
    drafts = []
    for s in shapes:
        cfg = s.config(target_cfg)
        drafts.append(_Stepper(Model(cfg, init_weights(cfg, seed=seed)), cfg, context, rng))
    for d in [target] + drafts:                      # first touches (page faults, BLAS buffers) out of the way
        d.step()
    ratios = np.zeros((rounds, len(shapes)))
    draft_ms = np.zeros((rounds, len(shapes)))
    target_ms = []
    for r in range(rounds):
        t_round, d_round = [], []
        for d in drafts:
            t_round.append(target.step())
            d_round.append(np.median([d.step() for _ in range(gamma)]))
        t_med = float(np.median(t_round))
        ratios[r] = np.array(d_round) / t_med
        draft_ms[r] = np.array(d_round) * 1e3
        target_ms.append(t_med * 1e3)
        log(f"round {r + 1}/{rounds}: target step {t_med * 1e3:.1f} ms")
    rows = []
    for i, s in enumerate(shapes):
        cfg = s.config(target_cfg)
        rows.append({"shape": s, "label": s.label(target_cfg.vocab_size), "parameters": cfg.num_parameters(),
                     "draft_ms": float(np.median(draft_ms[:, i])), "c": float(np.median(ratios[:, i])),
                     "c_min": float(ratios[:, i].min()), "c_max": float(ratios[:, i].max()),
                     "c_p25": float(np.percentile(ratios[:, i], 25)), "c_p75": float(np.percentile(ratios[:, i], 75))})
    rows.append({"target_ms": float(np.median(target_ms)), "target_ms_min": float(min(target_ms)),
                 "target_ms_max": float(max(target_ms)), "context": context, "gamma": gamma, "rounds": rounds})
    return rows


def c_table(rows: list[dict]) -> str:
    """Markdown: one line per candidate, then the target's step."""
    lines = ["| draft | parameters | step (ms) | c median | c p25-p75 | c min-max |", "|---|---|---|---|---|---|"]
    for r in rows[:-1]:
        lines.append(f"| {r['label']} | {r['parameters'] / 1e6:.1f} M | {r['draft_ms']:.2f} | {r['c']:.3f} | "
                     f"{r['c_p25']:.3f}-{r['c_p75']:.3f} | {r['c_min']:.3f}-{r['c_max']:.3f} |")
    t = rows[-1]
    lines.append(f"\nTarget decode step: median {t['target_ms']:.1f} ms over {t['rounds']} rounds "
                 f"({t['target_ms_min']:.1f}-{t['target_ms_max']:.1f}); context {t['context']} tokens, "
                 f"{t['gamma']} draft steps after each target step.")
    return "\n".join(lines)


def largest_within(rows: list[dict], c_max: float = 0.1) -> dict | None:
    """The candidate with the most parameters in its layers (not its vocabulary rows) whose median c <= c_max;
    among equals, the larger LM head."""
    ok = [r for r in rows[:-1] if r["c"] <= c_max]
    if not ok:
        return None
    return max(ok, key=lambda r: (r["parameters"] - 2 * r["shape"].lm_head_rows * r["shape"].hidden_size,
                                  r["shape"].lm_head_rows))
