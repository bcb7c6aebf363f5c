"""SmolLM2's roofline figures: the measured floor (one pass over its weight bytes) beside its measured step."""
from app.views.fragments import model_line
from engine.experiments.measure import verify_cost_steps
from engine.model.layout import weights_of
from engine.serving.jobs import run_to_end


def test_the_loaded_model_describes_its_weight_bytes_and_their_measured_stream(smollm2):
    d = smollm2.describe()
    assert d["weight_bytes"] == sum(w.nbytes for w in weights_of(smollm2.model))
    assert 530e6 < d["weight_bytes"] < 545e6              # 134.5 M float32 parameters with the LM head's copy
    assert d["weights_stream_ms"] > 0 and d["layout"] == smollm2.model.layout


def test_the_model_line_shows_the_floor_beside_the_step():
    md = {"weights_stream_ms": 19.0, "weight_bytes": 538e6}
    assert model_line("m", md, None) == "m · its 538 MB of weights stream in 19.0 ms here (28 GB/s)"
    assert model_line("m", md, 21.1) == ("m · decode 21.1 ms, weights stream in 19.0 ms: 90% of this machine's "
                                         "memory bandwidth")
    assert model_line("m", {}, 21.1) == "m"                   # a model in the caches: no floor to show


def test_the_cost_model_measures_the_floor_with_the_curve(smollm2_engine, smollm2):
    here = run_to_end(verify_cost_steps(smollm2_engine.registry, smollm2))
    assert here["weight_bytes"] == smollm2.describe()["weight_bytes"]
    # a step reads every weight at least once: it cannot beat one bare pass by much. Against the step measured
    # beside the pass (the same clock, the two taking turns, so that a busy machine slows both alike), not the
    # curve's t(1): that is engine time, the thread's CPU time, while the pass is timed on the wall clock
    row = next(r for r in here["roofline"] if r["threads"] == here["threads"])
    assert 0 < here["floor_ms"] == row["predicted_ms"] < 2 * row["step_ms"], here["roofline"]
