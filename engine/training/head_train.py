"""Training loop for the draft heads (EAGLE and Medusa) on a frozen target's stored hidden states.

One process trains both heads on random windows of the data (EAGLE every step, Medusa on a smaller
batch every `medusa_every` steps), AdamW, cosine schedule. Everything resumes from
`state_dir/state.npz` (weights, moments, step, sampler state), written every `ckpt_every` steps; the
data folder is re-read every `reload_every` steps, so training may start while the data is still
being generated. `export` writes float16 safetensors for engine/spec_decode/heads.py.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ..model.config import ModelConfig
from ..spec_decode.heads import LMRows
from . import heads
from .train import adamw_step, clip_grads


@dataclass
class HeadTrainConfig:
    steps: int = 3000
    batch_size: int = 8              # EAGLE windows per step
    medusa_batch_size: int = 4
    medusa_every: int = 2
    seq_len: int = 128
    num_medusa_heads: int = 4
    vocab_subset: int = 8192         # FR-Spec: the most frequent tokens of the data
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    reg_weight: float = 1.0          # EAGLE's feature regression against its token loss
    prompt_positions: bool = False   # count the prompt's positions too (after the shared system prompt)
    depth: int = 1                   # EAGLE draft steps unrolled in training (training-time test)
    step_decay: float = 0.8          # the loss weight of unrolled step s is step_decay^s
    feature_noise: float = 0.1       # uniform noise on input features (EAGLE-1), for drafting on its own
    seed: int = 0
    init_from: str = ""              # a folder of exported heads to start from (warm start; moments start at 0)
    ckpt_every: int = 50
    reload_every: int = 60
    eval_every: int = 200            # held-out acceptance (data folder's sibling heldout/), 0: never
    eval_conversations: int = 24


@dataclass
class Conversation:
    ids: np.ndarray          # [L] int64
    first: int               # the first position t whose next token x_{t+1} is counted (an answer token)
    feats: np.ndarray        # [L - 1, C] float16, x / |x|


def load_conversations(folder: Path) -> list[Conversation]:
    out = []
    f = folder / "conversations.jsonl"
    for line in (f.read_text().splitlines() if f.is_file() else []):
        c = json.loads(line)
        feats = folder / "feats" / f"{c['index']:05d}.npy"
        if feats.is_file():
            out.append(Conversation(np.asarray(c["ids"], np.int64), c["n_prompt"] - 1, np.load(feats)))
    return out


def frequent_tokens(convs: list[Conversation], vocab_size: int, n: int) -> np.ndarray:
    """The n most frequent tokens of the answers (ties and the rest filled by id: BPE ids roughly follow
    merge order, i.e. frequency in the tokenizer's corpus), sorted by id."""
    counts = np.zeros(vocab_size, np.int64)
    for c in convs:
        np.add.at(counts, c.ids[c.first + 1:], 1)
    order = np.lexsort((np.arange(vocab_size), -counts))
    return np.sort(order[:min(n, vocab_size)])


def coverage(convs: list[Conversation], subset: np.ndarray) -> float:
    answers = np.concatenate([c.ids[c.first + 1:] for c in convs])
    return float(np.isin(answers, subset).mean())


def shared_prefix(convs) -> int:
    """The length of the token prefix every conversation starts with (a chat template's system prompt)."""
    if not convs:
        return 0
    first = convs[0].ids
    n = min(min(len(c.ids) for c in convs), len(first))
    for c in convs[1:]:
        n = min(n, int(np.argmin(np.append(c.ids[:n] == first[:n], False))))
    return n


def windows(convs, n, T, extra, rng, scale, from_prompt: int | None = None):
    """n windows of T (+ extra) positions: features f [n, T + extra, C] (unit RMS, zero-padded), next
    tokens [n, T], mask [n, T] of counted positions (t >= first and t + 1 + extra within the features).
    from_prompt: count from this position instead of the answer's first (the prompt's tokens after the
    shared system prompt: the target's distribution there is as good a teacher, on more positions)."""
    C = convs[0].feats.shape[1]
    f = np.zeros((n, T + extra + 1, C), np.float32)
    nxt = np.zeros((n, T), np.int64)
    mask = np.zeros((n, T), bool)
    for b in range(n):
        c = convs[rng.integers(len(convs))]
        L = len(c.feats)                                   # features exist for positions 0..L-1
        t0 = int(rng.integers(0, max(1, L - T - extra)))
        m = min(T + extra + 1, L - t0)
        f[b, :m] = c.feats[t0:t0 + m] * scale
        k = min(T, len(c.ids) - 1 - t0)
        nxt[b, :k] = c.ids[t0 + 1:t0 + 1 + k]
        t = np.arange(t0, t0 + T)
        mask[b] = (t >= (c.first if from_prompt is None else from_prompt) - 1) & (t + 1 + extra < L)
    return f, nxt, mask


def exported_params(folder: Path) -> tuple[dict, np.ndarray]:
    """Exported heads (eagle/medusa.safetensors) -> float32 parameters by name, their vocabulary subset."""
    from safetensors.numpy import load_file
    params, subset = {}, None
    for kind in ("eagle", "medusa"):
        if (folder / f"{kind}.safetensors").is_file():
            w = load_file(str(folder / f"{kind}.safetensors"))
            subset = w.pop("vocab_subset").astype(np.int64)
            params.update({k: v.astype(np.float32) for k, v in w.items()})
    if subset is None:
        raise FileNotFoundError(f"no exported heads in {folder}")
    return params, subset


class HeadTrainer:
    def __init__(self, tc: HeadTrainConfig, target_cfg: ModelConfig, embed, out_embed, norm_w, data_dir: Path,
                 state_dir: Path, log=print):
        """embed: the target's input embedding; out_embed: its LM head's rows (the same when tied)."""
        self.tc, self.target_cfg, self.data_dir, self.state_dir, self.log = tc, target_cfg, data_dir, state_dir, log
        self.embed, self.norm_w = embed.astype(np.float32), norm_w.astype(np.float32)
        self.convs = load_conversations(data_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        state = state_dir / "state.npz"
        if state.is_file():
            z = np.load(state, allow_pickle=False)
            self.subset = z["subset"]
            self.params = {k[2:]: z[k] for k in z.files if k.startswith("p:")}
            self.m = {k[2:]: z[k] for k in z.files if k.startswith("m:")}
            self.v = {k[2:]: z[k] for k in z.files if k.startswith("v:")}
            meta = json.loads(str(z["meta"]))
            self.step, self.history, self.train_s = meta["step"], meta["history"], meta["train_s"]
            self.trained_with = meta["config"]          # the settings of the last training run
            self.rng = np.random.default_rng()
            self.rng.bit_generator.state = meta["rng"]
            log(f"resumed at step {self.step}")
        else:
            self.subset = frequent_tokens(self.convs, target_cfg.vocab_size, tc.vocab_subset)
            self.rng = np.random.default_rng(tc.seed)
            self.params = {**heads.init_eagle(self.eagle_cfg, self.rng),
                           **heads.init_medusa(target_cfg.hidden_size, tc.num_medusa_heads)}
            if tc.init_from:
                self.params.update(exported_params(Path(tc.init_from))[0])
            self.m = {k: np.zeros_like(p) for k, p in self.params.items()}
            self.v = {k: np.zeros_like(p) for k, p in self.params.items()}
            self.step, self.history, self.train_s = 0, [], 0.0
            self.trained_with = asdict(tc)
        self.out_embed = out_embed
        self.set_subset(self.subset)

    def set_subset(self, subset) -> None:
        """The heads' weights do not depend on S (they predict features); S only bounds the softmax."""
        self.subset = subset
        self.head_w = np.ascontiguousarray((self.out_embed[subset] * self.norm_w).astype(np.float32))   # [Vs, C]

    @property
    def eagle_cfg(self) -> ModelConfig:
        return heads.eagle_config(self.target_cfg, len(self.subset) if hasattr(self, "subset") else self.tc.vocab_subset)

    def lr(self) -> float:
        tc, s = self.tc, self.step
        if s < tc.warmup_steps:
            return tc.lr * (s + 1) / tc.warmup_steps
        t = min(1.0, (s - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps))
        return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    def train_step(self) -> dict:
        tc, rng, scale = self.tc, self.rng, np.float32(math.sqrt(self.target_cfg.hidden_size))
        start = shared_prefix(self.convs) if tc.prompt_positions else None
        f, nxt, mask = windows(self.convs, tc.batch_size, tc.seq_len, 0, rng, scale, start)
        f_in = f[:, :-1] + rng.uniform(-tc.feature_noise, tc.feature_noise, f[:, :-1].shape).astype(np.float32)
        eagle = {k: p for k, p in self.params.items() if not k.startswith("medusa.")}
        loss, parts, cache = heads.eagle_forward(eagle, self.eagle_cfg, f_in, self.embed[nxt], f[:, 1:], mask,
                                                 self.head_w, tc.reg_weight, tc.depth, tc.step_decay)
        grads = heads.eagle_backward(cache, self.eagle_cfg)
        out = {"eagle": float(loss), **parts}
        if self.step % tc.medusa_every == 0:
            K = tc.num_medusa_heads
            f, _, mask = windows(self.convs, tc.medusa_batch_size, tc.seq_len, K - 1, rng, scale, start)
            medusa = {k: p for k, p in self.params.items() if k.startswith("medusa.")}
            loss, per_head, caches = heads.medusa_forward(medusa, f, mask, self.head_w)
            grads.update(heads.medusa_backward(caches))
            out.update(medusa=float(loss), medusa_heads=[round(x, 3) for x in per_head])
        lr = self.lr()
        params = {k: self.params[k] for k in grads}
        clip_grads(grads, tc.grad_clip)
        adamw_step(params, grads, {k: self.m[k] for k in grads}, {k: self.v[k] for k in grads}, self.step, lr, tc)
        self.step += 1
        return out

    def save(self) -> None:
        meta = {"step": self.step, "history": self.history, "train_s": self.train_s, "rng": self.rng.bit_generator.state,
                "config": asdict(self.tc)}
        arrays = {"subset": self.subset, "meta": np.array(json.dumps(meta)),
                  **{"p:" + k: p for k, p in self.params.items()}, **{"m:" + k: p for k, p in self.m.items()},
                  **{"v:" + k: p for k, p in self.v.items()}}
        tmp = self.state_dir / "state.tmp.npz"
        np.savez(tmp, **arrays)
        tmp.replace(self.state_dir / "state.npz")

    def run(self) -> None:
        tc = self.tc
        self.log(f"{len(self.convs)} conversations; subset {len(self.subset)} tokens, "
                 f"coverage {coverage(self.convs, self.subset):.4f}")
        while self.step < tc.steps:
            if self.step % tc.reload_every == 0 and self.step:     # data still being generated
                self.convs = load_conversations(self.data_dir)
                self.set_subset(frequent_tokens(self.convs, self.target_cfg.vocab_size, tc.vocab_subset))
            t = time.time()
            out = self.train_step()
            self.train_s += time.time() - t
            if self.step % 10 == 0:
                self.history.append({"step": self.step, **out})
                self.log(f"step {self.step}/{tc.steps} {json.dumps(out)} lr {self.lr():.2e} "
                         f"{time.time() - t:.2f} s/step, {len(self.convs)} conversations")
            if self.step % tc.ckpt_every == 0 or self.step == tc.steps:
                self.save()
            if tc.eval_every and self.step % tc.eval_every == 0 and self.held_out:
                acc = self.evaluate(self.held_out[:tc.eval_conversations], 4)
                self.history.append({"step": self.step, "held_out": acc})
                self.log(f"held-out at step {self.step}: {json.dumps(acc)}")

    @property
    def held_out(self) -> list[Conversation]:
        if not hasattr(self, "_held_out"):
            self._held_out = load_conversations(self.data_dir.parent / "heldout")
        return self._held_out

    def evaluate(self, convs: list[Conversation], gamma: int) -> dict:
        """Held-out acceptance per position and mean acceptance length (engine/training/head_eval.py)."""
        from .head_eval import eagle_acceptance, medusa_acceptance
        scale = np.float32(math.sqrt(self.target_cfg.hidden_size))
        eagle = {k: p for k, p in self.params.items() if not k.startswith("medusa.")}
        medusa = {k: p for k, p in self.params.items() if k.startswith("medusa.")}
        out = {"coverage": coverage(convs, self.subset)}
        if eagle:
            out["eagle"] = eagle_acceptance(eagle, self.eagle_cfg, convs, self.subset,
                                            LMRows({"head": self.out_embed, "norm": self.norm_w}), self.embed, gamma, scale)
        if medusa:
            out["medusa"] = medusa_acceptance(medusa, convs, self.subset, self.head_w, min(gamma, len(medusa)), scale)
        return out

    def load_exported(self, folder: Path) -> None:
        """Evaluate shipped heads: their float16 weights and vocabulary subset replace the trained ones."""
        self.params, subset = exported_params(folder)
        self.set_subset(subset)

    def export(self, out_dir: Path, vocab_subset: int | None = None) -> dict:
        """float16 safetensors: eagle.safetensors, medusa.safetensors (each with the vocabulary subset: the
        `vocab_subset` most frequent tokens of all the data, the heads' weights do not depend on it)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.convs = load_conversations(self.data_dir)
        subset = frequent_tokens(self.convs, self.target_cfg.vocab_size, vocab_subset or self.tc.vocab_subset)
        for kind in ("eagle", "medusa"):
            w = {k: p.astype(np.float16) for k, p in self.params.items() if k.startswith("medusa.") == (kind == "medusa")}
            save_file({**w, "vocab_subset": subset}, str(out_dir / f"{kind}.safetensors"))
        kinds: dict[str, int] = {}
        answers = 0
        for c in self.convs:
            answers += len(c.ids) - c.first - 1
        for line in (self.data_dir / "conversations.jsonl").read_text().splitlines():
            kind = json.loads(line)["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
        timing = self.data_dir / "timing.jsonl"
        generation_s = sum(json.loads(x)["s"] for x in timing.read_text().splitlines()) if timing.is_file() else None
        return {"subset": len(subset), "steps": self.step, "train_s": self.train_s,
                "data": {"conversations": len(self.convs), "by_kind": kinds, "answer_tokens": answers,
                         "coverage_in_data": coverage(self.convs, subset), "generation_s": generation_s},
                "config": self.trained_with}
