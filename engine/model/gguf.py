"""A llama.cpp GGUF file -> our checkpoint layout (Hugging Face LlamaForCausalLM names), converted once.

Read with the `gguf` package's own reader and dequantized with its own functions. Four facts of the
format matter, each checked by tests/smollm2/test_smollm2_gguf.py:

- A tensor's GGUF `shape` lists its dimensions innermost first: [in, out] for a linear layer. The
  dequantized array is (out, in), which is how Hugging Face stores linear weights: no transpose.
- llama.cpp's converter permutes the rows of Q and K within each head so that rotary pairs are
  adjacent, (x0, x1), (x2, x3), ... (Meta's interleaved RoPE). Our engine rotates halves, (x_i, x_{i+hd/2})
  (Hugging Face's layout); `unpermute_rope_rows` undoes the permutation, per head of Q (9 heads for
  SmolLM2-135M) and per KV head of K (3). A wrong layout still writes fluent-looking text: check logits.
- Without an `output.weight` tensor the LM head is tied to the token embedding (tie_word_embeddings).
- The tokenizer is in the metadata: tokens, merges, token types (3 = control: registered as special
  tokens, or `<|im_start|>` is split into pieces), the pre-tokenizer's name, BOS/EOS ids, the chat template.

    cfg, weights, tokenizer = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "cache/models/smollm2-135m")   # then load_checkpoint
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .chat import recognise_template
from .checkpoint import save_checkpoint
from .config import ModelConfig
from .tokenizer import TextTokenizer

# GGUF tensor name -> Hugging Face name ({i} = layer)
TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
CONTROL_TOKEN = 3          # tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
USER_DEFINED_TOKEN = 4
PRE_TOKENIZERS = {"smollm", "gpt2", "default"}    # the ones `tokenizer_from_gguf` builds


class GGUFError(ValueError):
    """A GGUF file this converter does not support; the message says what and why."""


def field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return TENSOR_NAMES.get(".".join(["blk", "{i}", *parts[2:]]), "").format(i=parts[1]) or None
    return TENSOR_NAMES.get(gguf_name)


def float32_value(x) -> float:
    """A GGUF float32 as the shortest decimal that is the same float32 (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def config_from_gguf(reader: gguf.GGUFReader, name: str = "custom") -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"architecture {arch!r}: only llama is supported")
    n_heads = field(reader, "llama.attention.head_count")
    hidden = field(reader, "llama.embedding_length")
    names = {t.name for t in reader.tensors}
    vocab = field(reader, "llama.vocab_size") or len(field(reader, "tokenizer.ggml.tokens"))
    return ModelConfig(
        hidden_size=hidden, num_hidden_layers=field(reader, "llama.block_count"),
        num_attention_heads=n_heads, num_key_value_heads=field(reader, "llama.attention.head_count_kv", n_heads),
        intermediate_size=field(reader, "llama.feed_forward_length"), vocab_size=vocab,
        max_position_embeddings=field(reader, "llama.context_length"),
        head_dim=field(reader, "llama.rope.dimension_count", hidden // n_heads),
        rms_norm_eps=float32_value(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float32_value(field(reader, "llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id"), name=name)


def dequantized(tensor) -> np.ndarray:  # a ReaderTensor -> float32 [out, in] (GGUF shape [in, out] reversed)
    w = gguf.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    declared = tuple(int(d) for d in reversed(tensor.shape))
    if w.shape != declared:
        raise GGUFError(f"{tensor.name}: dequantized to {w.shape}, GGUF declares {tuple(tensor.shape)} "
                        f"(innermost first), so {declared} was expected")
    return w


def unpermute_rope_rows(w, n_heads: int):  # [n_heads hd, in] -> [n_heads hd, in]
    """Undo llama.cpp's Q/K row permutation: interleaved rotary pairs back to rotate-half halves.

    Per head, llama.cpp's row j of the first half-index went to row 2j, of the second half to 2j+1:
    rows (n_heads, 2, hd/2) were written as (n_heads, hd/2, 2). Reading them back swaps the two axes.
    """
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def permute_rope_rows(w, n_heads: int):  # [n_heads hd, in] -> [n_heads hd, in]
    """llama.cpp's converter's permutation (the inverse of `unpermute_rope_rows`): rotate-half rows to pairs."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def weights_from_gguf(reader: gguf.GGUFReader, cfg: ModelConfig, unpermute: bool = True) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32 under its Hugging Face name; Q and K rows back in HF order.

    `unpermute=False` keeps llama.cpp's row order (only for tests showing that it is wrong).
    """
    weights = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise GGUFError(f"tensor {t.name!r} has no Hugging Face Llama counterpart")
        w = dequantized(t)
        if unpermute and name.endswith("q_proj.weight"):
            w = unpermute_rope_rows(w, cfg.num_attention_heads)
        elif unpermute and name.endswith("k_proj.weight"):
            w = unpermute_rope_rows(w, cfg.num_key_value_heads)
        weights[name] = np.ascontiguousarray(w)
    return weights


def tokenizer_from_gguf(reader: gguf.GGUFReader) -> TextTokenizer:
    """Byte-level BPE from the GGUF's tokens and merges, with its control tokens registered as special.

    Pre-tokenizer `smollm` (llama.cpp's name): every digit on its own, then GPT-2's split into words,
    numbers, punctuation runs and spaces; `gpt2` is the split alone. No BOS is added (add_bos_token false).
    """
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        raise GGUFError(f"tokenizer model {field(reader, 'tokenizer.ggml.model')!r}: only gpt2 (byte-level BPE)")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"pre-tokenizer {pre!r}: supported are {sorted(PRE_TOKENIZERS)}")
    if field(reader, "tokenizer.ggml.add_bos_token", False):
        raise GGUFError("add_bos_token is true: not supported (this engine never adds a BOS by itself)")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), split] if pre == "smollm" else [split])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN])
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED_TOKEN])
    bos, eos = field(reader, "tokenizer.ggml.bos_token_id"), field(reader, "tokenizer.ggml.eos_token_id")
    config = {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "bos_token": tokens[bos] if bos is not None else None,
              "eos_token": tokens[eos] if eos is not None else None,
              "model_max_length": field(reader, "llama.context_length")}
    template = field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template          # Hugging Face's field, kept verbatim for other tools
        chat = recognise_template(template)
        if chat is not None:
            config.update(chat.to_config())         # ours: which pure function renders it (engine/model/chat.py)
    return TextTokenizer(tok, config)


def read_gguf(path: str | Path, name: str = "custom", unpermute: bool = True):
    """(config, float32 weights in the HF layout, tokenizer) from a GGUF file."""
    reader = gguf.GGUFReader(str(path))
    cfg = config_from_gguf(reader, name)
    return cfg, weights_from_gguf(reader, cfg, unpermute), tokenizer_from_gguf(reader)


def convert_gguf(path: str | Path, out_dir: str | Path, dtype=np.float32) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json into out_dir.

    float32 keeps the dequantized values exactly (Q4_1 and Q8_0 values are products of a float16 scale
    and small integers); float16 halves the file and rounds them. Written to a temporary folder first
    and renamed, so that out_dir is either absent or complete.
    """
    out_dir = Path(out_dir)
    cfg, weights, tokenizer = read_gguf(path, out_dir.name)
    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, cfg, weights, tokenizer, dtype=dtype)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
