"""KV cache dtypes: bytes equal the formula and what the store holds; quantization error bounds."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.kv.cache import KVCacheManager
from engine.kv.dtypes import KV_CACHE_DTYPES, kv_bytes_per_token, resolve_kv_cache_dtype
from engine.model.llama import forward, forward_no_cache

ELEMENT_BYTES = {"auto": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8_per_token_head": 1}
# Max |logit error| against float32, relative to the logits' standard deviation, measured on a random
# seed-sized model (std 0.05 weights) over a 100-token prefill plus 200 decode steps, with ~2x headroom.
ERROR_BOUND = {"auto": 1e-5, "float16": 0.005, "bfloat16": 0.03, "int8_per_token_head": 0.1,
               "fp8_e4m3": 0.5, "fp8_e5m2": 1.0}


@pytest.mark.parametrize("dtype", list(KV_CACHE_DTYPES))
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_bytes_equal_the_formula_and_the_store(make_model, dtype, kv_heads):
    model, _ = make_model("seed-target", num_key_value_heads=kv_heads)
    cfg = model.cfg
    scales = 2 if dtype == "int8_per_token_head" else 0
    formula = cfg.num_hidden_layers * 2 * kv_heads * (cfg.head_dim * ELEMENT_BYTES[dtype] + scales)
    assert kv_bytes_per_token(cfg, dtype) == formula
    mgr = KVCacheManager(cfg, num_blocks=5, block_size=16, kv_cache_dtype=dtype)
    assert mgr.store.nbytes() == 5 * 16 * formula
    seq = mgr.new_sequence()
    mgr.append_slots(seq, list(range(20)))
    assert mgr.bytes_used(seq) == 20 * formula
    assert mgr.bytes_allocated() == 2 * 16 * formula


RESIDENT_GROWTH = """
import os
from engine.model.config import ModelConfig
from engine.kv.cache import KVCacheManager

def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = resident_bytes()
mgr = KVCacheManager(ModelConfig.from_name("seed-target"), num_blocks=1024, block_size=16)
print(resident_bytes() - before, mgr.store.nbytes())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory from Linux's /proc")
def test_a_pool_holds_its_memory_from_the_start():
    """Like vLLM's preallocated KV cache: the pool's pages are written when it is made, so that no first
    write to a page (a page fault) lands inside a generation's measured forward. Measured in a process of its
    own: in the test process other apps' threads (a server's warm-up) allocate and free meanwhile."""
    out = subprocess.run([sys.executable, "-c", RESIDENT_GROWTH], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    grown, nbytes = map(int, out.split())
    assert nbytes == 48 * 2 ** 20                        # float32 K/V of 1,024 blocks
    assert grown >= 0.9 * nbytes, (grown, nbytes)        # np.zeros alone leaves it unmapped: ~0 here


def test_seed_figures_for_its_own_model():
    # The seed: 4 layers x 2 x 4 heads x head dim 24 x 512 tokens x 4 bytes = 1,572,864 bytes.
    from engine.model.config import ModelConfig
    cfg = ModelConfig(hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4)
    assert kv_bytes_per_token(cfg, "fp32") * 512 == 1_572_864
    assert kv_bytes_per_token(cfg, "fp16") * 512 == 786_432


def test_aliases_and_unknown_dtype():
    assert resolve_kv_cache_dtype("fp8").name == "fp8_e4m3"
    assert resolve_kv_cache_dtype("INT8").name == "int8_per_token_head"
    assert resolve_kv_cache_dtype("fp32").name == "auto"
    with pytest.raises(ValueError, match="not a KV cache dtype: one of auto, float16"):
        resolve_kv_cache_dtype("fp4")


@pytest.mark.parametrize("dtype", list(KV_CACHE_DTYPES))
def test_quantized_logits_stay_within_stated_bounds(make_model, dtype):
    model, _ = make_model("seed-target", seed=1, std=0.05)
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, 300)
    ref = forward_no_cache(model, tokens)
    mgr = KVCacheManager(model.cfg, num_blocks=24, block_size=16, kv_cache_dtype=dtype)
    seq = mgr.new_sequence()
    out = [forward(model, tokens[:100], 0, mgr.append_slots(seq, tokens[:100]))]
    for i in range(100, 300):
        out.append(forward(model, tokens[i:i + 1], i, mgr.append_slots(seq, tokens[i:i + 1])))
    err = np.abs(np.concatenate(out) - ref).max() / ref.std()
    assert err <= ERROR_BOUND[dtype]
    if dtype != "auto":
        assert err > 0, "a quantized cache that loses nothing is not quantizing"
