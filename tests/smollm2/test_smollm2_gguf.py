"""GGUF -> checkpoint: shapes, the tied head, the real config, and the rotary layout checked by logits."""
import numpy as np
import pytest

from engine.model.checkpoint import load_checkpoint
from engine.model.gguf import config_from_gguf, dequantized, hf_name, permute_rope_rows, unpermute_rope_rows
from engine.model.llama import Model, forward_no_cache
from engine.spec_decode.sampling import softmax


def rope_rotate_half(x, pos, theta=10000.0):  # [hd]: pairs (i, i + hd/2), Hugging Face
    half = len(x) // 2
    ang = pos / theta ** (np.arange(half) / half)
    a, b = x[:half], x[half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)])


def rope_interleaved(x, pos, theta=10000.0):  # [hd]: pairs (2j, 2j + 1), Meta / llama.cpp
    half = len(x) // 2
    ang = pos / theta ** (np.arange(half) / half)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2], out[1::2] = a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)
    return out


def test_unpermute_undoes_llamacpp_and_keeps_attention_scores():
    """Interleaved RoPE on llama.cpp's rows == rotate-half RoPE on the unpermuted rows (per head)."""
    rng = np.random.default_rng(0)
    n_heads, hd, c = 3, 8, 5
    wq, wk = rng.standard_normal((2, n_heads * hd, c))
    x1, x2 = rng.standard_normal((2, c))
    gq, gk = permute_rope_rows(wq, n_heads), permute_rope_rows(wk, n_heads)
    assert np.array_equal(unpermute_rope_rows(gq, n_heads), wq)
    for h in range(n_heads):
        rows = slice(h * hd, (h + 1) * hd)
        hf = rope_rotate_half(wq[rows] @ x1, 7) @ rope_rotate_half(wk[rows] @ x2, 3)
        cpp = rope_interleaved(gq[rows] @ x1, 7) @ rope_interleaved(gk[rows] @ x2, 3)
        assert hf == pytest.approx(cpp)
        # and the permuted rows with our rotate-half are NOT the same attention
        assert rope_rotate_half(gq[rows] @ x1, 7) @ rope_rotate_half(gk[rows] @ x2, 3) != pytest.approx(hf)


def test_config_is_read_from_the_metadata(gguf_reader):
    cfg = config_from_gguf(gguf_reader)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert (cfg.vocab_size, cfg.max_position_embeddings) == (49152, 8192)
    assert cfg.rope_theta == 100000.0 and cfg.rms_norm_eps == 1e-5
    assert cfg.tie_word_embeddings and (cfg.bos_token_id, cfg.eos_token_id) == (1, 2)
    assert cfg.num_parameters() == 134_515_008       # SmolLM2-135M


def test_dequantized_tensors_match_the_declared_shapes(gguf_reader):
    names = {t.name for t in gguf_reader.tensors}
    assert "output.weight" not in names                                   # the LM head is tied ...
    kinds = {}
    for t in gguf_reader.tensors:
        w = dequantized(t)
        assert w.dtype == np.float32 and w.shape == tuple(reversed([int(d) for d in t.shape])), t.name
        assert hf_name(t.name) is not None, t.name
        kinds[t.name.split(".")[-2]] = t.tensor_type.name
    assert kinds["token_embd"] == "Q8_0"                                   # ... to the Q8_0 embedding
    assert kinds["attn_q"] == "Q4_1" and kinds["attn_norm"] == "F32"


def test_the_cached_checkpoint_is_the_gguf_dequantized_and_unpermuted(smollm2_dir, gguf_reader):
    cfg, weights, _ = load_checkpoint(smollm2_dir, with_tokenizer=False)
    tensors = {t.name: t for t in gguf_reader.tensors}
    assert cfg.tie_word_embeddings and "lm_head.weight" not in weights
    assert np.array_equal(weights["model.embed_tokens.weight"], dequantized(tensors["token_embd.weight"]))
    for i in (0, 29):
        q, k = dequantized(tensors[f"blk.{i}.attn_q.weight"]), dequantized(tensors[f"blk.{i}.attn_k.weight"])
        assert np.array_equal(weights[f"model.layers.{i}.self_attn.q_proj.weight"], unpermute_rope_rows(q, 9))
        assert np.array_equal(weights[f"model.layers.{i}.self_attn.k_proj.weight"], unpermute_rope_rows(k, 3))
        assert np.array_equal(weights[f"model.layers.{i}.self_attn.v_proj.weight"],
                              dequantized(tensors[f"blk.{i}.attn_v.weight"]))       # V is not rotated


def test_logits_tell_the_right_rotary_layout_from_the_wrong_one(smollm2_dir, tokenizer):
    """Teacher-forced answer "The capital of France is Paris.": the right layout predicts it (mean NLL ~0.35 nats);
    llama.cpp's row order left in place still runs, but predicts it badly (~4 nats) and answers differently."""
    cfg, weights, _ = load_checkpoint(smollm2_dir, with_tokenizer=False)
    prompt = tokenizer.encode(tokenizer.chat_template.prompt("What is the capital of France?"))
    answer = tokenizer.encode("The capital of France is Paris.<|im_end|>")
    wrong = dict(weights)
    for i in range(cfg.num_hidden_layers):
        for proj, heads in (("q_proj", 9), ("k_proj", 3)):
            name = f"model.layers.{i}.self_attn.{proj}.weight"
            wrong[name] = permute_rope_rows(weights[name], heads)
    nll, first = {}, {}
    for layout, w in (("right", weights), ("wrong", wrong)):
        logits = forward_no_cache(Model(cfg, w), prompt + answer)[len(prompt) - 1:-1]
        logp = np.log(softmax(logits))
        nll[layout] = -logp[np.arange(len(answer)), answer].mean()
        first[layout] = int(logits[0].argmax())
    assert nll["right"] < 1.0 and nll["wrong"] > nll["right"] + 2.0, nll
    assert first["right"] == answer[0] != first["wrong"]
