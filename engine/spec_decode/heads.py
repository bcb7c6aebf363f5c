"""Draft heads (vLLM's `eagle` and `medusa`): small networks on the target's last hidden state that
propose draft tokens, behind the Proposer contract of engine/spec_decode/draft.py.

Both end in the target's own LM head restricted to a frequent-token subset S of the vocabulary
(FR-Spec, Zhao et al. 2025), so a draft step does not pay for the whole vocabulary; EAGLE's also holds the
tokens the session's context has outside S (`ContextVocabulary`). Their q is zero outside those;
verification (engine/spec_decode/verify.py) stays exact, the residual covers the other tokens.

- EAGLE-1 (Li et al. 2024): z = [f_t, emb(x_{t+1})] W_fc -> one Llama decoder layer with its own paged
  KV cache -> h; h's norm is the predicted next feature and (norm h) @ LM head[S] the next token. It
  drafts autoregressively on its own features; after verification its cache is rolled back to the
  entries made from the target's real features, and the next round catches up with the new ones. With
  speculative_eagle_topk > 1 it drafts an EAGLE-2 dynamic tree instead (engine/spec_decode/eagle_tree.py).
- Medusa-1 (Cai et al. 2024): K heads r_i = f_t + SiLU(f_t W_i); head i proposes token t+1+i from the
  same f_t, all K in one pass. With speculative_eagle_topk > 1 they draft Medusa's tree of their top-k
  instead (engine/spec_decode/medusa_tree.py).

Features: engine.model.llama.forward's with_hidden rows, x / |x| (trained as x / rms(x) = sqrt(C) x / |x|;
the factor is folded into the first matrix of each head here). Weights: models/heads/<target>/*.safetensors
(engine/training/head_train.py writes them).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from ..kv.runner import ForwardRequest, PagedRunner
from ..model.config import ModelConfig
from ..model.layout import LAYOUTS, choose_split_rows, use_layout, weight_rows, weight_vec
from ..model.llama import Model
from .draft import Draft, DraftParams, Proposer
from .eagle_tree import draft_tree
from .medusa_tree import medusa_tree
from .proposers import point_masses
from .sampling import full_vocab, probs_from_logits, sample

HEADS_DIR = Path(__file__).resolve().parents[2] / "models" / "heads"
METHODS = ("eagle", "medusa")


class FeatureLog:
    """The target's hidden state at every position of one session, as its forwards compute them.

    Rows past the target runner's tokens are stale (rejected drafts) and get overwritten; `start` is the
    first position that has a row. Positions served by the prefix cache were never computed: their rows
    come from `shared` (the engine's rows per cached block hash, filled by `share`), else the head starts
    after them."""

    def __init__(self, width: int):
        self.rows = np.zeros((256, width), np.float32)
        self.start = None

    def record(self, runner) -> None:
        if runner.hidden is None:
            return
        p0, n = runner.hidden_p0, len(runner.hidden)
        if p0 + n > len(self.rows):
            grown = np.zeros((max(2 * len(self.rows), p0 + n), self.rows.shape[1]), np.float32)
            grown[:len(self.rows)] = self.rows
            self.rows = grown
        self.rows[p0:p0 + n] = runner.hidden
        if self.start is None or p0 < self.start:
            self.start = p0
        if p0 and p0 == getattr(runner, "cached_tokens", 0) and p0 == self.start:   # a prefill with cached blocks
            bs = runner.manager.block_size
            rows = [shared_rows.get((id(runner.manager), h)) for h in runner.seq.block_hashes[:p0 // bs]]
            if len(rows) * bs == p0 and all(r is not None for r in rows):
                self.rows[:p0] = np.concatenate(rows)
                self.start = 0

    def share(self, runner, limit: int = 1024) -> None:
        """Offer the rows of the runner's committed full blocks to later sessions (see `record`)."""
        if self.start is None or not hasattr(runner, "seq"):
            return
        bs = runner.manager.block_size
        for b, h in enumerate(runner.seq.block_hashes):
            key = (id(runner.manager), h)       # one manager per model and cache dtype: rows depend on both
            if key not in shared_rows and b * bs >= self.start:
                shared_rows[key] = self.rows[b * bs:(b + 1) * bs].copy()
                if len(shared_rows) > limit:
                    shared_rows.pop(next(iter(shared_rows)))


shared_rows: dict = {}    # (KV cache manager, block hash) -> the target's hidden states of that block [block_size, C]


class ContextVocabulary:
    """An EAGLE head's draft vocabulary in one session: its subset S, then every token of the context outside S.

    S holds the training answers' most frequent tokens; an answer also repeats rare tokens of its own context
    (a subject's name, the words of a text it summarises), which S misses and a draft could never propose.
    Their rows of the same frozen LM head cost little: at most one per context token. (Medusa's heads, which
    guess further ahead from one feature, drafted worse with them held out: docs/benchmarks.md.)"""

    def __init__(self, head):
        self.ids = head.subset                                 # [Vs + n]: the draft vocabulary's token ids
        self.rows = np.zeros((0, head.lm_rows.shape[1]), np.float32)   # [n, C]: the LM head's rows of the extra ones
        self.lm_rows, self.known, self.seen = head.lm_rows, set(head.subset.tolist()), 0

    def update(self, tokens) -> None:
        """Add the context's tokens outside the vocabulary (`tokens`: the session's, prompt and output)."""
        new = [x for x in dict.fromkeys(tokens[min(self.seen, len(tokens)):]) if x not in self.known]
        self.seen = len(tokens)
        if new:
            self.known.update(new)
            self.ids = np.concatenate([self.ids, np.asarray(new, np.int64)])
            self.rows = np.concatenate([self.rows, self.lm_rows[new]])

    def logits(self, subset_logits, z):  # [.., Vs], the LM head's input [.., C] -> [.., Vs + n]
        return np.concatenate([subset_logits, z @ self.rows.T], axis=-1) if len(self.rows) else subset_logits


class LMRows:
    """Rows of the target's LM head with its final norm's weight folded in, g * E[x]: [n, C] for token ids x."""

    def __init__(self, target_weights: dict):
        self.head, self.norm = target_weights["head"], target_weights["norm"]
        self.shape = self.head.shape

    def __getitem__(self, ids):
        return (self.head[np.asarray(ids)] * self.norm).astype(np.float32)


class EagleHead:
    """EAGLE-1 weights for one target: a one-layer `Model` over the subset vocabulary (its LM head is the
    target's final norm times the subset's rows of the output embedding) plus the fusing matrix.
    target_weights: {"embed": input embedding [V, C], "head": output embedding [V, C], "norm": [C]}.
    layout: the target's weight layout (engine/model/layout.py); the layer and its LM head rows take the same one, as
    the call pattern that streams the target's weights fastest streams the head's too."""
    role = "eagle"

    def __init__(self, target_name: str, target_cfg: ModelConfig, target_weights: dict, head_weights: dict,
                 layout: str = "arrays"):
        self.subset = head_weights["vocab_subset"].astype(np.int64)
        c = target_cfg.hidden_size
        self.cfg = target_cfg.replace(num_hidden_layers=1, vocab_size=len(self.subset), tie_word_embeddings=True,
                                      name=f"{target_name}-eagle")
        self.name = self.cfg.name
        layer = {k: v.astype(np.float32) for k, v in head_weights.items() if k.startswith("model.layers.0.")}
        self.model = Model(self.cfg, {**layer, "model.embed_tokens.weight": target_weights["head"][self.subset],
                                      "model.norm.weight": target_weights["norm"]})
        fc = head_weights["fc.weight"].astype(np.float32).T                        # [2C, C]
        fc[:c] *= math.sqrt(c)                                                     # features arrive as x / |x|
        self.w_fc = np.ascontiguousarray(fc)
        if layout in LAYOUTS:
            use_layout(self.model, layout)
            self.w_fc = LAYOUTS[layout](self.w_fc)
        self.target_embed = np.ascontiguousarray(target_weights["embed"], np.float32)   # [V, C]
        self.sqrt_c = np.float32(math.sqrt(c))
        self.lm_rows = LMRows(target_weights)
        self.vocab_size = target_cfg.vocab_size
        self.num_parameters = int(sum(v.size for k, v in head_weights.items() if k != "vocab_subset"))

    def inputs(self, feats, tokens):  # [n, C], [n] -> the layer's input [n, C]
        return self.model.dot(np.concatenate([feats, self.target_embed[np.asarray(tokens)]], axis=1), self.w_fc)


class MedusaHead:
    """Medusa-1 heads for one target; `layout` as EagleHead's (the heads' matrices stream like the target's)."""
    role = "medusa"

    def __init__(self, target_name: str, target_cfg: ModelConfig, target_weights: dict, head_weights: dict,
                 layout: str = "arrays"):
        self.subset = head_weights["vocab_subset"].astype(np.int64)
        c = target_cfg.hidden_size
        self.name = f"{target_name}-medusa"
        ws = [head_weights[f"medusa.{i}.weight"].astype(np.float32) for i in range(len(head_weights) - 1)]
        self.num_heads = len(ws)
        self.w = np.ascontiguousarray(np.concatenate([w.T for w in ws], axis=1) * np.float32(math.sqrt(c)))  # [C, K C]
        emb = target_weights["head"][self.subset].astype(np.float32)
        self.lm_head = np.ascontiguousarray(target_weights["norm"][:, None] * emb.T)    # [C, Vs]
        self.vec_dot = self.dot = np.dot
        if layout in LAYOUTS:
            self.w, self.lm_head = LAYOUTS[layout](self.w), LAYOUTS[layout](self.lm_head)
            self.vec_dot, self.dot = weight_vec, weight_rows
        self.sqrt_c = np.float32(math.sqrt(c))
        self.vocab_size = target_cfg.vocab_size
        self.num_parameters = int(sum(w.size for w in ws))

    def logits(self, feat):  # [C] (x / |x|) -> [K, Vs]
        a = self.vec_dot(feat, self.w)                                             # f W_i for all i: [K C]
        r = feat * self.sqrt_c + (a / (1.0 + np.exp(-a))).reshape(self.num_heads, -1)   # f + SiLU(f W_i): [K, C]
        return self.dot(r, self.lm_head)


def draft_from(logits, ids, vocab_size, temperature, top_p, rng):  # -> (token, q [V] or None, display logits [V])
    full = full_vocab(logits, ids, vocab_size)
    if temperature == 0:
        return int(ids[int(np.argmax(logits))]), None, full
    q = probs_from_logits(full, temperature, top_p)
    return sample(q, rng), q, full


class EagleProposer(Proposer):
    """Drafts with an EAGLE head over its own paged KV cache; `features` is the session's FeatureLog."""
    method = "eagle"

    def __init__(self, head: EagleHead, runner: PagedRunner, features: FeatureLog):
        self.head, self.runner, self.features = head, runner, features
        self.vocab = ContextVocabulary(head)
        self.start = None        # the position of the head's first cache entry
        self.real = 0            # entries made from the target's own features (kept after verification)

    def propose(self, tokens, params: DraftParams, rng):
        """A chain of γ tokens, each drawn from the head's q (the argmax when greedy); with eagle_topk > 1 an
        EAGLE-2 dynamic tree of depth γ instead (engine/spec_decode/eagle_tree.py)."""
        logits = yield from self.catch_up(tokens)
        if params.eagle_topk > 1:
            return (yield from draft_tree(self, logits, params, rng))
        head, runner, vocab = self.head, self.runner, self.vocab
        k, temperature, top_p = params.num_speculative_tokens, params.temperature, params.top_p
        drafts, qs, shown = [], [], []
        for i in range(k):
            logits = vocab.logits(logits, runner.hidden[-1] * head.sqrt_c)       # the LM head's input: rms-normed
            x, q, full = draft_from(logits, vocab.ids, head.vocab_size, temperature, top_p, rng)
            drafts.append(x)
            shown.append(full)
            if q is not None:
                qs.append(q)
            if i == k - 1 or params.stops_at(logits, x, q):
                break
            feat = runner.hidden[-1:]                                               # the predicted feature
            logits = (yield ForwardRequest(runner, [x], last_only=True, inputs_embeds=head.inputs(feat, [x])))[-1]
        q = np.array(qs) if qs else point_masses(drafts, head.vocab_size)
        return Draft.chain(drafts, q, np.array(shown), forward_calls=len(drafts))   # the catch-up, then one a draft

    def catch_up(self, tokens):  # generator -> the head's logits over its subset after the root [Vs]
        """The head's entries of the target's real features since the last round, j = (f_j, x_{j+1}) up to the
        root's (the context's last token), in one forward; its hidden state there is the root's predicted
        feature. The context's new tokens join the draft vocabulary."""
        head, runner, feats = self.head, self.runner, self.features
        if self.start is None:
            self.start = feats.start
        last = len(tokens) - 2                       # entry j = (f_j, x_{j+1}); the last one with a real f_j
        first = self.start + self.real
        new = tokens[first + 1:last + 2]
        logits = (yield ForwardRequest(runner, new, last_only=True,
                                       inputs_embeds=head.inputs(feats.rows[first:last + 1], new)))[-1]
        self.real = last + 1 - self.start
        self.vocab.update(tokens)
        return logits

    def rollback(self, num_valid: int) -> None:
        """Drop the entries made from predicted features (the drafting ones); the next round catches up."""
        self.runner.truncate(self.real)


class MedusaProposer(Proposer):
    """K heads on the hidden state that produced the last token: up to K drafts in one pass."""
    method = "medusa"

    def __init__(self, head: MedusaHead, features: FeatureLog):
        self.head, self.features = head, features

    def propose(self, tokens, params: DraftParams, rng):
        yield from ()                      # the heads run on a feature the target computed: no forward of its own
        k = min(params.num_speculative_tokens, self.head.num_heads)
        rows = self.head.logits(self.features.rows[len(tokens) - 2])[:k]          # [k, Vs]
        if params.eagle_topk > 1:                  # the Cartesian tree of the heads' top-k (medusa_tree.py)
            return medusa_tree(rows, self.head.subset, self.head.vocab_size, params, rng)
        drafts, qs, shown = [], [], []
        for row in rows:
            x, q, full = draft_from(row, self.head.subset, self.head.vocab_size, params.temperature, params.top_p, rng)
            drafts.append(x)
            shown.append(full)
            if q is not None:
                qs.append(q)
            if params.stops_at(row, x, q):
                break                      # the later heads' drafts follow this doubtful one: not verified
        q = np.array(qs) if qs else point_masses(drafts, self.head.vocab_size)
        return Draft.chain(drafts, q, np.array(shown), forward_calls=k)              # one head, one draft step


def demo_settings(target_name: str, threads: int, heads_dir: Path = HEADS_DIR) -> dict | None:
    """EAGLE's best γ and confidence threshold (and a tree's top-k and budget where a tree was fastest) for a
    target at `threads` weight-product threads, as `bench heads` measured them (its folder's demo.json, per
    thread count): the entry of the most threads measured up to `threads`, else of the fewest; None without one.
    Verification and drafting scale differently with threads (cli/bench/heads.py), so the best setting is a
    property of the thread count."""
    try:
        by_threads = json.loads((Path(heads_dir) / target_name / "demo.json").read_text())["by_threads"]
        entries = {int(t): e for t, e in by_threads.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not entries:
        return None
    at = max((t for t in entries if t <= threads), default=min(entries))
    e = entries[at]
    tree = {k: int(e[k]) for k in ("speculative_eagle_topk", "speculative_num_draft_tokens") if e.get(k)}
    return {"num_speculative_tokens": int(e["num_speculative_tokens"]),
            "draft_confidence_threshold": float(e.get("draft_confidence_threshold", 0.0)), **tree, "threads": at}


def available_heads(target_name: str, heads_dir: Path = HEADS_DIR) -> list[str]:
    return [m for m in METHODS if (Path(heads_dir) / target_name / f"{m}.safetensors").is_file()]


def load_heads(target_name: str, target_cfg: ModelConfig, embed, checkpoint_dir, heads_dir: Path = HEADS_DIR,
               layout: str = "arrays") -> dict:
    """{'eagle': EagleHead, 'medusa': MedusaHead} for the heads shipped for this target (maybe none).
    embed: the target's input embedding [V, C] (float32); the final norm's weight is read from its checkpoint;
    layout: the target model's weight layout (see EagleHead)."""
    with safe_open(str(Path(checkpoint_dir) / "model.safetensors"), "numpy") as f:
        norm_w = f.get_tensor("model.norm.weight").astype(np.float32)
        head = f.get_tensor("lm_head.weight") if "lm_head.weight" in f.keys() else None
    target_weights = {"embed": embed, "head": embed if head is None else head.astype(np.float32), "norm": norm_w}
    out = {}
    folder = Path(heads_dir) / target_name
    for method, cls in (("eagle", EagleHead), ("medusa", MedusaHead)):
        f = folder / f"{method}.safetensors"
        if f.is_file():
            out[method] = cls(target_name, target_cfg, target_weights, load_file(str(f)), layout)
    if "eagle" in out:                  # its layer's products: measured as any loaded model's (loaded_model.py)
        choose_split_rows(out["eagle"].model)
    return out
