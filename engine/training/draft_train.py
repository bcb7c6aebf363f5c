"""A small draft model for a chat target, distilled from the target's own answers (nanoGPT-style flat loop).

The draft is a Llama decoder (LlamaForCausalLM: engine/training/llama.py's forward and handwritten backward)
with the target's tokenizer and its full vocabulary, so that any engine can run it as a draft model. The
data is the target's greedy answers to chat prompts with its top-k next-token distribution at every
position (engine/training/head_data.py, `topk`); the loss is the cross-entropy against that distribution,
renormalised over its k tokens (distillation with soft targets), on every position after the shared system
prompt (the prompt's tokens have a teacher distribution too).

Two choices keep a step affordable on one CPU core:
- The softmax of a step runs over a sampled vocabulary: a frequent-token subset S (the answers' most
  frequent tokens, as the EAGLE head's FR-Spec subset) plus every token in the step's teacher top-k. Rows
  outside it get no gradient from the head that step (llama.forward's head_rows).
- The input embedding and LM head are one tied matrix (as SmolLM2's), initialised from the target's own
  embedding projected onto its top principal directions (`projected_embedding`): the draft starts out
  reading and writing tokens in the target's coordinates.

Everything resumes from `state_dir/state.npz` (weights, AdamW moments, step, the sampler's state), written
every `ckpt_every` steps; the data folder is re-read every `reload_every` steps (training may start while
the data is still being generated). `export` writes the Hugging Face checkpoint.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..model.checkpoint import init_weights
from ..model.config import ModelConfig
from . import llama
from .head_eval import _chain_acceptance, _summary
from .head_train import coverage, frequent_tokens, shared_prefix
from .train import TrainState, adamw_step, clip_grads, get_lr


@dataclass
class DraftTrainConfig:
    num_hidden_layers: int = 4       # the shape `train-draft TARGET measure` chose for SmolLM2 (model card)
    hidden_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 704
    head_dim: int = 64
    vocab_subset: int = 8192         # frequent tokens always in a step's softmax (with the teacher's top-k)
    steps: int = 3000
    batch_size: int = 8              # conversations (windows) per step
    seq_len: int = 256               # at most this many positions per window
    lr: float = 2e-3                 # peak learning rate
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1        # AdamW, on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    ckpt_every: int = 25
    log_every: int = 10
    eval_every: int = 200            # held-out acceptance; 0: never
    reload_every: int = 100          # re-read the data folder (it may still be growing)
    init: str = ""                   # a draft folder (`export`) to start from instead of random layers: trains a
                                     # shipped draft further, on more data, with a schedule of its own

    def model_config(self, target: ModelConfig) -> ModelConfig:
        """The draft's LlamaForCausalLM config: the target's vocabulary, tokens, context and RoPE base."""
        return ModelConfig(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           intermediate_size=self.intermediate_size, head_dim=self.head_dim,
                           vocab_size=target.vocab_size, max_position_embeddings=target.max_position_embeddings,
                           rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta, tie_word_embeddings=True,
                           bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id,
                           name=f"{target.name}-draft")


@dataclass
class Conversation:
    ids: np.ndarray                  # [L] int64: prompt (chat template) + greedy answer
    first: int                       # the first position t whose next token x_{t+1} is an answer token
    top_ids: np.ndarray | None       # [L - 1, k] int32: the target's k most probable tokens after x_t
    top_probs: np.ndarray | None     # [L - 1, k] float16


def load_conversations(folder: Path, with_topk: bool = True) -> list[Conversation]:
    """A data folder of engine/training/head_data.py; with_topk: only conversations whose top-k file exists."""
    out = []
    f = folder / "conversations.jsonl"
    for line in (f.read_text().splitlines() if f.is_file() else []):
        c = json.loads(line)
        top = folder / "topk" / f"{c['index']:05d}.npz"
        if with_topk and not top.is_file():
            continue
        z = np.load(top) if with_topk else None
        out.append(Conversation(np.asarray(c["ids"], np.int64), c["n_prompt"] - 1,
                                z["ids"] if z is not None else None, z["probs"] if z is not None else None))
    return out


def projected_embedding(embed, width: int):  # [V, C] -> [V, width]: E P, P the top `width` principal directions
    """The target's embedding in fewer dimensions: P holds the eigenvectors of E^T E with the largest eigenvalues,
    so E P keeps the most of E's energy any `width`-dimensional projection can (and E P P^T is E's best rank-`width`
    approximation: logits of the tied head start as the target's embedding similarities, projected)."""
    e = embed.astype(np.float64)
    vals, vecs = np.linalg.eigh(e.T @ e)                            # ascending
    return (e @ vecs[:, ::-1][:, :width]).astype(np.float32)


def init_params(tc: DraftTrainConfig, cfg: ModelConfig, target_embed) -> dict:
    """Random layers (engine.model.checkpoint.init_weights), the projected embedding, and a final norm weight that
    starts the logits near uniform: at first the residual stream is mostly the input token's embedding, and
    the tied head would give that same token a logit of sqrt(C) |e|, a confident wrong guess."""
    params = init_weights(cfg, seed=tc.seed)
    e = projected_embedding(target_embed, cfg.hidden_size)
    params["model.embed_tokens.weight"] = e
    rms_row = float(np.sqrt((e * e).sum(-1).mean()))
    params["model.norm.weight"][:] = 1.0 / (np.sqrt(cfg.hidden_size) * rms_row)
    return params


def load_init(folder: str, cfg: ModelConfig) -> tuple[dict, dict]:  # -> float32 weights, what its training.json says
    """A draft exported by an earlier run, to train further: its shape has to be this run's."""
    from ..model.checkpoint import load_checkpoint
    got, params, _ = load_checkpoint(folder, with_tokenizer=False)
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "head_dim", "vocab_size", "tie_word_embeddings")
    wrong = [f"{k} {getattr(got, k)} (this run: {getattr(cfg, k)})" for k in keys if getattr(got, k) != getattr(cfg, k)]
    if wrong:
        raise ValueError(f"init {folder}: not this run's shape: {', '.join(wrong)}")
    done = Path(folder) / "training.json"
    prior = json.loads(done.read_text()) if done.is_file() else {}
    return params, {"from": str(folder), "steps": prior.get("steps"), "train_s": prior.get("train_s"),
                    "conversations": prior.get("data", {}).get("conversations"), "earlier": prior.get("init")}


# --- batches -------------------------------------------------------------------------------------
def get_batch(convs, tc: DraftTrainConfig, rng, count_from: int, pad_id: int):
    """Random windows of conversations -> ids [B, T], teacher top-k ids [B, T, k] and probabilities [B, T, k]
    (renormalised over k; zero where a position does not count: before `count_from` - 1 or past the end).
    A conversation longer than seq_len + 1 gives a window at a random offset; T is the longest window."""
    picks = [convs[i] for i in rng.integers(len(convs), size=tc.batch_size)]
    starts = [int(rng.integers(0, max(1, len(c.ids) - tc.seq_len))) for c in picks]
    T = min(tc.seq_len, max(len(c.ids) - 1 - t0 for c, t0 in zip(picks, starts)))
    k = picks[0].top_ids.shape[1]
    ids = np.full((tc.batch_size, T), pad_id, np.int64)
    top = np.zeros((tc.batch_size, T, k), np.int64)
    probs = np.zeros((tc.batch_size, T, k), np.float32)
    for b, (c, t0) in enumerate(zip(picks, starts)):
        n = min(T, len(c.ids) - 1 - t0)
        ids[b, :n] = c.ids[t0:t0 + n]
        top[b, :n] = c.top_ids[t0:t0 + n]
        p = c.top_probs[t0:t0 + n].astype(np.float32)
        p /= p.sum(-1, keepdims=True)
        p[np.arange(t0, t0 + n) < count_from - 1] = 0.0
        probs[b, :n] = p
    return ids, top, probs


def head_vocabulary(subset, top, probs):  # -> the step's sampled vocabulary [Vh], top as its columns [B, T, k]
    vocab = np.union1d(subset, top[probs > 0])
    return vocab, np.searchsorted(vocab, top)      # columns of tokens that do not count are never read


# --- held-out acceptance ---------------------------------------------------------------------------
def acceptance(params, cfg: ModelConfig, convs, subset, gamma: int = 4) -> dict:
    """Greedy acceptance of the draft on stored greedy answers, offline: draft k of a chain started after x_t
    is right when the draft's argmax equals x_{t+k}. A draft model reads the true tokens while its drafts are
    right, so one teacher-forced forward per conversation gives every chain. Two draft vocabularies: the full
    one, and S plus the context's tokens up to x_t (as the EAGLE head's ContextVocabulary) -> {"full": .., "subset":
    ..}, each as head_eval's summaries (per_position, mean_acceptance_length, ...)."""
    totals = {"full": np.zeros(3 * gamma + 1), "subset": np.zeros(3 * gamma + 1)}
    in_subset = np.zeros(cfg.vocab_size, bool)
    in_subset[subset] = True
    for c in convs:
        ids = c.ids[:min(len(c.ids), cfg.max_position_embeddings + 1)]
        logits, _ = llama.forward(params, cfg, ids[None, :-1])
        logits = logits[0]                                            # [n, V], n = L - 1: after x_t, for x_{t+1}
        n = len(logits)
        valid = np.arange(n) >= c.first
        truth = ids[1:]
        first_seen = np.full(cfg.vocab_size, n, np.int64)
        np.minimum.at(first_seen, ids[:-1], np.arange(n))
        allowed = in_subset[None, :] | (first_seen[None, :] <= np.arange(n)[:, None])   # [n, V]
        right = {"full": np.argmax(logits, -1) == truth,
                 "subset": np.argmax(np.where(allowed, logits, -np.inf), -1) == truth}
        for name, ok in right.items():
            totals[name] += _chain_acceptance(np.repeat(ok[None], gamma, 0), valid, gamma)
    return {name: _summary(t, gamma) for name, t in totals.items()}


def loss_curve(history, points: int = 16) -> list[dict]:  # the logged training losses, thinned to about `points`
    losses = [h for h in history if "loss" in h]
    picked = losses[::max(1, len(losses) // points)]
    picked += [h for h in losses[-1:] if h is not picked[-1]]
    return [{"step": h["step"], "loss": h["loss"], "conversations": h.get("conversations")} for h in picked]


# --- the loop --------------------------------------------------------------------------------------
class DraftTrainer:
    def __init__(self, tc: DraftTrainConfig, target_cfg: ModelConfig, target_embed, data_dir: Path, state_dir: Path,
                 held_out_dir: Path | None = None, resume: bool = False, log=print):
        self.tc, self.cfg, self.data_dir, self.state_dir, self.log = tc, tc.model_config(target_cfg), data_dir, state_dir, log
        self.held_out_dir = held_out_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.state_file = state_dir / "state.npz"
        if self.state_file.exists() and not resume:
            raise FileExistsError(f"{self.state_file} exists: pass --resume to continue it, or choose another --folder")
        if self.state_file.exists():                   # only the keys: the saved state fills them (and a resumed run
            params, prior = init_weights(self.cfg, seed=tc.seed), None      # never re-reads its init: it may be gone)
        else:
            params, prior = (load_init(tc.init, self.cfg) if tc.init
                             else (init_params(tc, self.cfg, target_embed), None))
        self.st = TrainState(params, {k: np.zeros_like(p) for k, p in params.items()},
                             {k: np.zeros_like(p) for k, p in params.items()}, np.random.default_rng(tc.seed))
        if prior is not None:                          # kept in the history, which the state saves: export reads it
            self.st.history.append({"step": 0, "init": prior})
        if self.state_file.exists():
            self.st.load(self.state_file)
            log(f"resumed from {self.state_file} at step {self.st.step}")
        self.reload()

    def reload(self) -> None:
        self.convs = load_conversations(self.data_dir)
        if not self.convs:
            raise FileNotFoundError(f"no conversations with top-k distributions in {self.data_dir}: run the data stage")
        self.subset = frequent_tokens(self.convs, self.cfg.vocab_size, self.tc.vocab_subset)
        self.count_from = shared_prefix(self.convs)

    @property
    def held_out(self) -> list[Conversation]:
        if not hasattr(self, "_held_out"):
            d = self.held_out_dir
            self._held_out = load_conversations(d, with_topk=False) if d is not None else []
        return self._held_out

    def train_step(self) -> tuple[float, float]:  # -> loss, gradient norm before clipping
        tc, st = self.tc, self.st
        ids, top, probs = get_batch(self.convs, tc, st.rng, self.count_from, self.cfg.eos_token_id or 0)
        vocab, cols = head_vocabulary(self.subset, top, probs)
        loss, cache = llama.forward(st.params, self.cfg, ids, (cols, probs), head_rows=vocab)
        grads = llama.backward(cache, self.cfg)
        del cache
        gnorm = clip_grads(grads, tc.grad_clip)
        adamw_step(st.params, grads, st.m, st.v, st.step, get_lr(st.step, tc), tc)
        st.step += 1
        return float(loss), gnorm

    def evaluate(self) -> dict:
        acc = acceptance(self.st.params, self.cfg, self.held_out, self.subset)
        return {"conversations": len(self.held_out), "full": acc["full"]["per_position"],
                "subset": acc["subset"]["per_position"]}

    def run(self, stop_at: int | None = None) -> None:
        tc, st = self.tc, self.st
        self.log(f"draft {self.cfg.num_hidden_layers} x {self.cfg.hidden_size}: {self.cfg.num_parameters():,} parameters; "
                 f"{len(self.convs)} conversations; subset {len(self.subset)} tokens, "
                 f"coverage {coverage(self.convs, self.subset):.4f}; {len(self.held_out)} held out")
        losses = []
        while st.step < tc.steps and st.step != stop_at:
            if st.step % tc.reload_every == 0 and st.step:
                self.reload()
            t = time.perf_counter()
            loss, gnorm = self.train_step()
            st.train_seconds += time.perf_counter() - t
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {st.step}")
            losses.append(loss)
            if st.step % tc.log_every == 0 or st.step == tc.steps:
                st.history.append({"step": st.step, "loss": round(float(np.mean(losses)), 4),
                                   "train_s": round(st.train_seconds, 1), "conversations": len(self.convs)})
                self.log(f"step {st.step}/{tc.steps} loss {np.mean(losses):.4f} |g| {gnorm:.2f} "
                         f"lr {get_lr(st.step, tc):.2e} {time.perf_counter() - t:.2f} s/step, "
                         f"{st.train_seconds / 60:.1f} min, {len(self.convs)} conversations")
                losses = []
            if tc.eval_every and self.held_out and (st.step % tc.eval_every == 0 or st.step == tc.steps):
                acc = self.evaluate()
                st.history.append({"step": st.step, "held_out": acc})
                self.log(f"held-out acceptance per position at step {st.step}: {json.dumps(acc)}")
            if st.step % tc.ckpt_every == 0 or st.step == tc.steps or st.step == stop_at:
                st.save(self.state_file, tc)

    def export(self, out: Path, target_dir: Path | None, vocab_subset: int | None = None) -> dict:
        """The Hugging Face checkpoint (config.json, model.safetensors in float16; the target's tokenizer files from
        target_dir, None: without them, as the engine reads the draft beside its target), the frequent-token subset (vocab_subset.json, for an engine that restricts the draft's LM head to it plus
        the context's tokens), and training.json (what the model card states)."""
        import shutil

        from ..model.checkpoint import save_checkpoint
        save_checkpoint(out, self.cfg, self.st.params)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if target_dir is not None and (target_dir / name).is_file():
                shutil.copyfile(target_dir / name, out / name)
        subset = frequent_tokens(self.convs, self.cfg.vocab_size, vocab_subset or self.tc.vocab_subset)
        (out / "vocab_subset.json").write_text(json.dumps(subset.tolist()) + "\n")
        answers = sum(len(c.ids) - c.first - 1 for c in self.convs)
        positions = sum(len(c.ids) - max(0, self.count_from - 1) - 1 for c in self.convs)
        timing = self.data_dir / "timing.jsonl"
        info = {"parameters": self.cfg.num_parameters(), "steps": self.st.step, "train_s": round(self.st.train_seconds, 1),
                "data": {"conversations": len(self.convs), "answer_tokens": answers, "counted_positions": positions,
                         "topk": int(self.convs[0].top_ids.shape[1]),
                         "generation_s": (round(sum(json.loads(x)["s"] for x in timing.read_text().splitlines()), 1)
                                          if timing.is_file() else None),
                         "coverage_of_subset": round(coverage(self.convs, subset), 4)},
                "vocab_subset": len(subset), "config": asdict(self.tc), "loss_curve": loss_curve(self.st.history),
                "init": next((h["init"] for h in self.st.history if "init" in h), None),
                "history": self.st.history[-40:]}
        if self.held_out:                              # the float16 weights as written
            shipped = {k: v.astype(np.float16).astype(np.float32) for k, v in self.st.params.items()}
            info["held_out"] = {"conversations": len(self.held_out),
                                **acceptance(shipped, self.cfg, self.held_out, subset)}
        (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
        return info
