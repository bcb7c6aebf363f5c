"""Our EAGLE head in vLLM's EAGLE layout (vLLM's `EagleLlamaForCausalLM`, model_executor/models/llama_eagle.py):
`train-heads TARGET export --format vllm`, and what `serve --vllm` speculates with.

vLLM's EAGLE-1 and ours differ in three places, so the export is a conversion, not a copy:
- vLLM feeds the target's hidden state after its final norm, g * f (f = x / rms(x), ours); it concatenates
  [embedding, hidden] where we concatenate [f, embedding];
- its one layer has no input norm (ours does), and no final norm before the LM head (ours: f_hat = h / rms(h),
  then (g * E)[S]); it feeds its raw output h back as the next step's hidden state (ours: f_hat);
- its LM head is the target's, the full vocabulary (ours: a subset plus the context's tokens).
Per channel, everything is exact: the residual stream is scaled by s = g / rho (fc, o_proj and down_proj
rows), so that vLLM's h is g * h / rho, its logits (g * h) @ E.T / rho (ours times rms(h) / rho: the same
argmax) and its fed-back h / g (through fc's hidden columns, which divide by g) is h / rho, ours h / rms(h).
What stays approximate is per token: the dropped input norm's 1 / rms(z), the post-attention norm's scale and
rms(h), each replaced by its median over calibration text (written to export.json). The greedy drafts then
differ from ours where those per-token scales matter; `bench heads` measures what that does to acceptance.

    export_eagle_for_vllm("smollm2-135m", out)      # out/{config.json, model.safetensors, export.json}
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ..model.checkpoint import load_checkpoint
from ..model.fetched import model_dir
from ..model.llama import Model, forward
from ..spec_decode.heads import HEADS_DIR
from . import llama, ops
from .heads import LAYER, eagle_config

FORMAT_VERSION = 1
CALIBRATION = (
    "The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafés.",
    "Photosynthesis is the process by which plants use sunlight, water and carbon dioxide to make glucose "
    "and oxygen. It takes place in the chloroplasts.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, a small robot lived in a quiet village. Every morning it watered the flowers and "
    "greeted the baker, who always gave it a warm loaf of bread.",
    "To make a cup of tea, boil water, put a tea bag in a cup, pour the water over it and wait three minutes.",
)


def _rms(x):  # [..., C] -> [...]
    return np.sqrt((x * x).mean(-1))


def calibrate(head: dict, cfg, weights: dict, tokenizer) -> dict:
    """Median per-token scales of our head on the target's own features over CALIBRATION: rms of the layer's
    input z, of its output h, and the post-attention norm's ratio rms(s * z2) / rms(z2)."""
    model = Model(cfg, weights)
    g, embed = weights["model.norm.weight"], weights["model.embed_tokens.weight"]
    ecfg = eagle_config(cfg, 1)
    zs, z2s, hs = [], [], []
    for text in CALIBRATION:
        ids = np.array(tokenizer.encode(text), np.int64)
        _, hidden = forward(model, ids, 0, None, with_hidden=True)
        f = hidden[:-1] * np.float32(np.sqrt(cfg.hidden_size))                     # x / rms(x) [T, C]
        z = np.concatenate([f, embed[ids[1:]]], -1) @ head["fc.weight"].T          # [T, C]
        cos, sin = ops.rope_tables(len(z), cfg.head_dim, cfg.rope_theta)
        h, cache = llama._layer_forward(z[None], head, LAYER, ecfg, cos, sin)
        xhat, rstd, _ = cache[6]                                                  # the post-attention norm's input
        zs.append(z)
        z2s.append((xhat / rstd)[0])
        hs.append(h[0])
    z, z2, h = (np.concatenate(a) for a in (zs, z2s, hs))
    rho_h = float(np.median(_rms(h)))
    s = g / rho_h
    return {"rms_z": float(np.median(_rms(z))), "rms_h": rho_h,
            "post_norm_ratio": float(np.median(_rms(z2 * s) / _rms(z2))), "tokens": int(len(z))}


def convert(head: dict, g: np.ndarray, scales: dict) -> dict:
    """vLLM's tensors (names as its EAGLE checkpoints: fc.weight, layers.0.*) from ours, float32."""
    c = g.shape[0]
    s = g / scales["rms_h"]                                                  # the residual stream's scale
    fc = head["fc.weight"]                                                   # [C, 2C]: [f, e] -> z
    out = {"fc.weight": s[:, None] * np.concatenate([fc[:, c:], fc[:, :c] / g[None, :]], axis=1)}
    p = "layers.0."
    qkv_in = head[LAYER + "input_layernorm.weight"] / s / scales["rms_z"]    # the input norm, folded in
    for name in ("q_proj", "k_proj", "v_proj"):
        out[p + f"self_attn.{name}.weight"] = head[LAYER + f"self_attn.{name}.weight"] * qkv_in[None, :]
    out[p + "self_attn.o_proj.weight"] = s[:, None] * head[LAYER + "self_attn.o_proj.weight"]
    out[p + "post_attention_layernorm.weight"] = (head[LAYER + "post_attention_layernorm.weight"] / s
                                                  * scales["post_norm_ratio"])
    for name in ("gate_proj", "up_proj"):
        out[p + f"mlp.{name}.weight"] = head[LAYER + f"mlp.{name}.weight"]
    out[p + "mlp.down_proj.weight"] = s[:, None] * head[LAYER + "mlp.down_proj.weight"]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def export_is_current(out: Path, key: str, digest: str, version: int) -> bool:
    """Whether `out` holds a finished export (its export.json, written last) of the source with this digest, in
    this format: an export is written again only when either changed."""
    record = out / "export.json"
    if not (record.is_file() and (out / "model.safetensors").is_file()):
        return False
    done = json.loads(record.read_text())
    return done.get(key) == digest and done.get("format_version") == version


def export_eagle_for_vllm(target: str, out: Path, heads_dir: Path = HEADS_DIR, cache=None) -> Path:
    """Write (or keep, if it is of the same head and format) the vLLM EAGLE checkpoint of `target`'s head."""
    src = Path(heads_dir) / target / "eagle.safetensors"
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no EAGLE head for {target} (train-heads {target} export)")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = Path(out)
    if export_is_current(out, "head_sha256", digest, FORMAT_VERSION):
        return out
    checkpoint = model_dir(target, cache)
    cfg, weights, tokenizer = load_checkpoint(checkpoint)
    head = {k: v.astype(np.float32) for k, v in load_file(str(src)).items() if k != "vocab_subset"}
    scales = calibrate(head, cfg, weights, tokenizer)
    tensors = convert(head, weights["model.norm.weight"], scales)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], torch_dtype="float32")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    record = {"format_version": FORMAT_VERSION, "head": str(src), "head_sha256": digest, "target": target,
              "scales": scales}
    (out / "export.json").write_text(json.dumps(record, indent=1) + "\n")
    return out
