"""A flat training loop (nanoGPT style): get_batch, get_lr, estimate_loss, AdamW, checkpoints.

The model math and its backward pass are in `llama.py` / `ops.py`; this file only feeds batches of
random windows of the corpus through them and updates the weights. Everything is float32 and
single-threaded BLAS, so the same seed gives the same weights bit for bit.

Two things are written:
  - `out/` : the Hugging Face checkpoint (config.json, model.safetensors in float16, tokenizer.json)
             plus `training.json` (hyperparameters, corpus record, losses, time) for the model card;
  - `state_dir/state.npz` : float32 weights, AdamW moments, step and the sampler's state, for --resume.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..model.checkpoint import init_weights, load_checkpoint, save_checkpoint
from ..model.config import ModelConfig
from . import llama
from .corpus import load_corpus


@dataclass
class TrainConfig:
    preset: str                      # the architecture: a name in engine.model.config.PRESETS
    steps: int = 1000
    batch_size: int = 8              # windows per step
    seq_len: int = 512               # tokens per window (positions 0..seq_len-1)
    lr: float = 2e-3                 # peak learning rate
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1        # AdamW, on matrices only (not on norm weights)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0           # clip the global gradient norm
    seed: int = 1337
    eval_every: int = 100
    eval_windows: int = 16           # fixed validation windows for the periodic estimate
    ckpt_every: int = 200
    init_from: str | None = None     # a checkpoint folder whose K/V heads are mean-pooled (Ainslie et al.)
    distill_from: str | None = None  # a teacher checkpoint: train on its next-token distribution
    distill_hidden: float = 0.0      # with a teacher of the same depth and width: weight of matching its
                                     # residual stream after every layer (llama.forward's hidden_targets)
    max_files: int | None = None     # use only the first N stdlib files (tiny CI runs)
    log_every: int = 10
    notes: str = ""


# ---------------------------------------------------------------------------------------------
def get_batch(data, batch_size, seq_len, rng):  # -> ids, targets [B, T] (targets shifted by one)
    starts = rng.integers(0, len(data) - seq_len - 1, batch_size)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = data[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def get_lr(step, tc: TrainConfig):  # linear warmup, then cosine down to lr * min_lr_ratio
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    t = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * coeff)


def val_windows(val, n, seq_len):  # n fixed, evenly spaced windows of the validation split
    starts = np.linspace(0, len(val) - seq_len - 1, n).astype(np.int64)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = val[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def estimate_loss(params, cfg, windows, batch_size=8):  # mean nats per token over fixed windows
    ids, tg = windows
    total = 0.0
    for i in range(0, len(ids), batch_size):
        loss, _ = llama.forward(params, cfg, ids[i:i + batch_size], tg[i:i + batch_size])
        total += float(loss) * len(ids[i:i + batch_size])
    return total / len(ids)


def full_val_loss(params, cfg, val, seq_len, batch_size=8):
    """Mean nats/char over the whole validation split in consecutive non-overlapping windows."""
    n = (len(val) - 1) // seq_len
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    w = val[idx].astype(np.int64)
    return estimate_loss(params, cfg, (w[:, :-1], w[:, 1:]), batch_size), n * seq_len


def teacher_outputs(teacher, ids):  # -> softmax of the teacher's logits [B, T, V], its residual streams
    t_cfg, t_params = teacher
    logits, hidden = llama.forward(t_params, t_cfg, ids)
    logits -= logits.max(-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(-1, keepdims=True)
    return logits, hidden


# --- AdamW ---------------------------------------------------------------------------------------
def adamw_step(params, grads, m, v, step, lr, tc: TrainConfig):  # updates params, m, v in place
    b1, b2 = tc.beta1, tc.beta2
    c1, c2 = 1 - b1 ** (step + 1), 1 - b2 ** (step + 1)
    for k, p in params.items():
        g = grads[k]
        m[k] *= b1
        m[k] += (1 - b1) * g
        v[k] *= b2
        v[k] += (1 - b2) * (g * g)
        if p.ndim == 2 and tc.weight_decay:
            p *= np.float32(1 - lr * tc.weight_decay)
        p -= np.float32(lr / c1) * m[k] / (np.sqrt(v[k] / np.float32(c2)) + np.float32(1e-8))


def clip_grads(grads, max_norm):  # -> norm before clipping
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm and norm > max_norm:
        s = np.float32(max_norm / (norm + 1e-6))
        for g in grads.values():
            g *= s
    return norm


# --- GQA / MQA from an MHA checkpoint (Ainslie et al. 2023) -------------------------------------
def mean_pool_kv(weights, src: ModelConfig, dst: ModelConfig):
    """Each new KV head is the mean of the G = src_kv / dst_kv consecutive old heads it replaces.

    Query head j reads kv head j // (H / K), so query heads of one new group are exactly the ones
    that read the pooled old heads."""
    assert src.num_key_value_heads % dst.num_key_value_heads == 0
    G = src.num_key_value_heads // dst.num_key_value_heads
    out = dict(weights)
    for k, w in weights.items():
        if k.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            heads = w.reshape(dst.num_key_value_heads, G, src.head_dim, w.shape[-1])
            out[k] = heads.mean(1).reshape(-1, w.shape[-1]).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
def progress_line(step, steps, loss, lr, tok_s, elapsed, eta):
    n = 20
    done = int(n * step / steps)
    return (f"[{'#' * done}{'.' * (n - done)}] step {step:5d}/{steps} loss {loss:.4f} lr {lr:.2e} "
            f"{tok_s:,.0f} tok/s elapsed {elapsed / 60:5.1f} min left {eta / 60:5.1f} min")


def starting_params(tc: TrainConfig, cfg: ModelConfig, val_ids, log):  # -> (params, loss before, source cfg)
    """Fresh weights, or another checkpoint's (its KV heads mean-pooled to this preset's) and its val loss."""
    if not tc.init_from:
        return init_weights(cfg, seed=tc.seed), None, None
    src_cfg, src_w, _ = load_checkpoint(tc.init_from, with_tokenizer=False)
    params = mean_pool_kv(src_w, src_cfg, cfg)
    loss_before, _ = full_val_loss(params, cfg, val_ids, min(tc.seq_len, len(val_ids) - 2))
    log(f"initialised from {tc.init_from}" + ("" if src_cfg.num_key_value_heads == cfg.num_key_value_heads else
        f" by mean-pooling {src_cfg.num_key_value_heads} -> {cfg.num_key_value_heads} KV heads") + f": val loss {loss_before:.4f}")
    return params, loss_before, src_cfg


def load_teacher(tc: TrainConfig, cfg: ModelConfig, log):  # -> (teacher cfg, teacher params) or None
    """The model to distil from: the loss becomes cross-entropy against its probabilities."""
    teacher = None
    if tc.distill_from:
        t_cfg, t_params, _ = load_checkpoint(tc.distill_from, with_tokenizer=False)
        teacher = (t_cfg, t_params)
        log(f"distilling from {tc.distill_from} ({t_cfg.num_parameters():,} parameters)")
    if tc.distill_hidden and (teacher is None or (teacher[0].num_hidden_layers, teacher[0].hidden_size)
                              != (cfg.num_hidden_layers, cfg.hidden_size)):
        raise ValueError("distill_hidden needs a teacher (distill_from) with the student's layers and width")
    return teacher


@dataclass
class TrainState:
    """Everything a resumed run needs: weights, AdamW moments, the batch sampler's state, progress."""
    params: dict
    m: dict
    v: dict
    rng: np.random.Generator
    step: int = 0
    history: list = field(default_factory=list)
    train_seconds: float = 0.0
    loss_before: float | None = None

    def save(self, path: Path, tc: TrainConfig) -> None:
        arrays = {"p/" + k: a for k, a in self.params.items()}
        arrays.update({"m/" + k: a for k, a in self.m.items()})
        arrays.update({"v/" + k: a for k, a in self.v.items()})
        meta = dict(step=self.step, history=self.history, train_seconds=self.train_seconds,
                    rng=self.rng.bit_generator.state, loss_before=self.loss_before, train_config=asdict(tc))
        tmp = path.with_name("state.tmp.npz")
        np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
        tmp.replace(path)

    def load(self, path: Path) -> None:
        st = np.load(path, allow_pickle=False)
        meta = json.loads(str(st["meta"]))
        self.params = {k: st["p/" + k] for k in self.params}
        self.m = {k: st["m/" + k] for k in self.params}
        self.v = {k: st["v/" + k] for k in self.params}
        self.rng.bit_generator.state = meta["rng"]
        self.step, self.history, self.train_seconds = meta["step"], meta["history"], meta["train_seconds"]
        self.loss_before = meta.get("loss_before", self.loss_before)


def train(tc: TrainConfig, out: str | Path, state_dir: str | Path | None = None, resume: bool = False,
          log=print, corpus=None, stop_at: int | None = None) -> dict | None:
    """Train one model; returns the summary also written to out/training.json.

    `stop_at` ends the run early after saving the state at that step (as an interrupted run would
    be); it returns None then."""
    out = Path(out)
    state_dir = Path(state_dir) if state_dir else Path("runs") / out.name
    state_dir.mkdir(parents=True, exist_ok=True)
    train_ids, val_ids, tok, record = corpus or load_corpus(max_files=tc.max_files)
    cfg = ModelConfig.from_name(tc.preset)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens, preset {tc.preset} only {cfg.vocab_size}")
    windows = val_windows(val_ids, tc.eval_windows, min(tc.seq_len, len(val_ids) - 2))
    params, loss_before, src_cfg = starting_params(tc, cfg, val_ids, log)
    teacher = load_teacher(tc, cfg, log)
    st = TrainState(params, {k: np.zeros_like(p) for k, p in params.items()},
                    {k: np.zeros_like(p) for k, p in params.items()}, np.random.default_rng(tc.seed),
                    loss_before=loss_before)
    state_file = state_dir / "state.npz"
    if resume and state_file.exists():
        st.load(state_file)
        log(f"resumed from {state_file} at step {st.step}")
    log(f"training {tc.preset}: {cfg.num_parameters():,} parameters, {cfg.attention_kind}, "
        f"{len(train_ids):,} train tokens, {tc.steps} steps x {tc.batch_size} x {tc.seq_len} tokens")
    if st.step == 0:
        st.history.append(dict(step=0, val_loss=round(estimate_loss(st.params, cfg, windows), 4), train_seconds=0.0))
        log(f"step 0: val loss {st.history[0]['val_loss']:.4f} nats/char (fixed {tc.eval_windows} windows)")
    t_last, tokens_since, loss_acc, n_acc = time.perf_counter(), 0, 0.0, 0
    while st.step < tc.steps:
        t0 = time.perf_counter()
        lr = get_lr(st.step, tc)
        ids, tg = get_batch(train_ids, tc.batch_size, tc.seq_len, st.rng)
        tg, hidden_tg = teacher_outputs(teacher, ids) if teacher is not None else (tg, None)
        loss, cache = llama.forward(st.params, cfg, ids, tg, hidden_tg, tc.distill_hidden)
        grads = llama.backward(cache, cfg)
        del cache
        gnorm = clip_grads(grads, tc.grad_clip)
        adamw_step(st.params, grads, st.m, st.v, st.step, lr, tc)
        st.step += 1
        st.train_seconds += time.perf_counter() - t0
        tokens_since, loss_acc, n_acc = tokens_since + ids.size, loss_acc + float(loss), n_acc + 1
        if not math.isfinite(float(loss)):
            raise FloatingPointError(f"loss is {loss} at step {st.step}")
        if st.step % tc.log_every == 0 or st.step == tc.steps:
            now = time.perf_counter()
            tok_s = tokens_since / (now - t_last)
            eta = (tc.steps - st.step) * tc.batch_size * tc.seq_len / tok_s
            log(progress_line(st.step, tc.steps, loss_acc / n_acc, lr, tok_s, st.train_seconds, eta)
                + f" |g| {gnorm:.2f}")
            t_last, tokens_since, loss_acc, n_acc = now, 0, 0.0, 0
        if st.step % tc.eval_every == 0 or st.step == tc.steps:
            vl = estimate_loss(st.params, cfg, windows)
            st.history.append(dict(step=st.step, val_loss=round(vl, 4), train_seconds=round(st.train_seconds, 1)))
            log(f"step {st.step}: val loss {vl:.4f} nats/char (fixed {tc.eval_windows} windows)")
        if st.step % tc.ckpt_every == 0 or st.step == tc.steps or st.step == stop_at:
            st.save(state_file, tc)
        if st.step == stop_at:
            return None
    return finish(tc, cfg, out, st, tok, record, val_ids, src_cfg, log)


def finish(tc: TrainConfig, cfg: ModelConfig, out: Path, st: TrainState, tok, record, val_ids, src_cfg,
           log) -> dict:
    """The final validation loss over the whole split, the checkpoint and out/training.json."""
    t0 = time.perf_counter()
    val_loss, val_tokens = full_val_loss(st.params, cfg, val_ids, min(tc.seq_len, len(val_ids) - 2))
    log(f"final val loss over the whole validation split ({val_tokens:,} tokens): {val_loss:.4f} nats/char "
        f"({time.perf_counter() - t0:.0f} s)")
    save_checkpoint(out, cfg, st.params, tok)
    summary = dict(name=out.name, preset=tc.preset, attention_kind=cfg.attention_kind,
                   parameters=cfg.num_parameters(), config=cfg.to_hf_dict(), train_config=asdict(tc),
                   corpus=record.to_dict(), steps=st.step, tokens_seen=st.step * tc.batch_size * tc.seq_len,
                   train_seconds=round(st.train_seconds, 1), val_loss=round(val_loss, 4),
                   val_tokens=val_tokens, val_loss_before_uptraining=(round(st.loss_before, 4)
                                                                      if st.loss_before is not None else None),
                   history=st.history, numpy=np.__version__, python=sys.version.split()[0])
    earlier = Path(tc.init_from or "") / "training.json"
    if tc.init_from and src_cfg.num_key_value_heads == cfg.num_key_value_heads and earlier.exists():
        # this run continued another of the same architecture (the draft's distillation stage): keep its record
        e = json.loads(earlier.read_text())
        summary["previous_stage"] = {k: e[k] for k in ("steps", "train_config", "train_seconds", "val_loss",
                                                       "tokens_seen", "history") if k in e}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
