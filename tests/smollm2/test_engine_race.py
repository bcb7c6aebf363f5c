"""Our numpy engine raced against a real llama.cpp server (xllamacpp, the same SmolLM2 weights in Q4_1):
the lanes carry what each reads per token, and the verdict the ratio those bytes predict beside the measured."""
import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.experiments.traces import trace
from engine.external.engine_race import decode_ms_per_token, engine_race, external_trace
from engine.external.llamacpp_server import EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.model.layout import weight_bytes

PROMPT = "Name three colours."
SETTINGS = {"chat": True, "max_tokens": 12, "temperature": 0.0, "method": "none"}


@pytest.fixture(scope="module")
def llamacpp(smollm2_dir):
    reason = unavailable_reason(gguf_path())
    if reason:
        pytest.skip(f"llama.cpp cannot run here, so the engine race is not tested: {reason}")
    server = EmbeddedLlamaCpp.start(gguf_path(), threads=1, parallel=1)
    yield server
    server.close()


def test_a_race_of_engines_predicts_from_weight_bytes_and_measures_decode(smollm2_engine, smollm2, llamacpp):
    ours = trace(smollm2_engine, PROMPT, {**SETTINGS, "model": "smollm2-135m"})
    with ThreadPoolExecutor(1) as pool:     # its own event loop (a browser test may hold this thread's)
        theirs = pool.submit(asyncio.run, external_trace(llamacpp.engine, PROMPT, SETTINGS)).result()
    assert theirs["error"] is None and theirs["num_output_tokens"] >= 2
    assert [t["t_ms"] for t in theirs["tokens"]] == sorted(t["t_ms"] for t in theirs["tokens"])
    assert "".join(t["text"] for t in theirs["tokens"]) == theirs["summary"]["text"]
    size = gguf_path().stat().st_size
    r = engine_race(ours, "numpy · float32", weight_bytes(smollm2.model), theirs, llamacpp.engine.name, size)
    a, b = r["lanes"]
    assert a["figures"]["weight_bytes_per_token"] > 500e6 and b["figures"]["weight_bytes_per_token"] == size
    assert r["verdict"]["predicted"] == pytest.approx(weight_bytes(smollm2.model) / size)
    assert r["verdict"]["speedup"] == pytest.approx(decode_ms_per_token(ours) / decode_ms_per_token(theirs))
    assert f"{r['verdict']['predicted']:.1f}× faster" in r["verdict"]["text"]
    assert b["figures"]["gb_per_s"] == pytest.approx(size / decode_ms_per_token(theirs) / 1e6)


def test_without_published_bytes_the_race_says_so():
    run = {"tokens": [{"status": "target", "t_ms": 1.0}, {"status": "target", "t_ms": 3.0}],
           "summary": None, "settings": {}, "elapsed_ms": 3.0}
    r = engine_race(run, "ours", 1000, dict(run), "remote vLLM", None)
    assert r["verdict"]["predicted"] is None and r["verdict"]["speedup"] == pytest.approx(1.0)
    assert "does not publish its weight bytes" in r["verdict"]["text"]
