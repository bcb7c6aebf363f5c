"""engine/serving/request_fit.py: the model a request runs on and the defaults of what it leaves out (docs/protocol.md,
"Settings left out, models chosen"), on an in-memory family plus a target no draft model serves (as SmolLM2)."""
from __future__ import annotations

import pytest

from engine.model.checkpoint import init_weights
from engine.model.config import ModelConfig
from engine.model.llama import Model
from engine.model.tokenizer import TextTokenizer
from engine.serving.registry import LoadedModel, ModelRegistry
from engine.serving.request_fit import EAGLE_DEFAULTS, fit_request, model_defaults
from engine.serving.settings import SettingsError


@pytest.fixture(scope="module")
def registry():
    ours = TextTokenizer.char_level("abcdefghijklmnopqrstuvwxyz ():\n.=_,")
    theirs = TextTokenizer.char_level("abcdefghijklmnopqrstuvwxyz")         # another vocabulary: no draft model
    base = ModelConfig.from_name("tiny").replace(vocab_size=ours.vocab_size, eos_token_id=None)

    def lm(name, role, tok, meta=None, **kw):
        cfg = base.replace(vocab_size=tok.vocab_size, **kw)
        return LoadedModel(name, role, cfg, Model(cfg, init_weights(cfg, seed=1)), tok, meta=meta or {"heads": []})

    return ModelRegistry([lm("t-mha", "target", ours, num_key_value_heads=4),
                          lm("t-gqa", "target", ours, num_key_value_heads=2),
                          lm("pretrained", "target", theirs, {"heads": ["eagle"]}, num_key_value_heads=2),
                          lm("bare", "target", theirs, {"heads": []}, num_key_value_heads=2, hidden_size=48),
                          lm("d", "draft", ours, hidden_size=16, num_hidden_layers=1)])


def test_a_models_defaults_are_what_it_can_draft_with(registry):
    assert model_defaults(registry, registry.models["t-mha"]) == {"method": "draft_model"}
    assert model_defaults(registry, registry.models["pretrained"]) == {"method": "eagle", **EAGLE_DEFAULTS}
    assert model_defaults(registry, registry.models["bare"]) == {"method": "ngram"}


def test_a_named_model_runs_with_its_defaults_and_what_it_cannot_take_is_an_error(registry):
    fit = fit_request(registry, {"model": "pretrained", "num_speculative_tokens": 2, "seed": None})
    assert (fit.model, fit.note) == ("pretrained", None)
    assert fit.settings == {"model": "pretrained", "method": "eagle", "num_speculative_tokens": 2,
                            "draft_confidence_threshold": 0.5}               # named kept, None and the rest filled
    with pytest.raises(SettingsError, match="^method: no draft model shares pretrained's vocabulary"):
        fit_request(registry, {"model": "pretrained", "method": "draft_model"})
    with pytest.raises(SettingsError, match="^num_kv_heads: 4 is not available for pretrained"):
        fit_request(registry, {"model": "pretrained", "num_kv_heads": 4})
    with pytest.raises(SettingsError, match="^model: unknown model 'nope'; available: t-mha, t-gqa, pretrained, bare"):
        fit_request(registry, {"model": "nope"})
    with pytest.raises(SettingsError, match="^model: 'd' is a draft model"):
        fit_request(registry, {"model": "d"})
    with pytest.raises(SettingsError, match="^num_speculative_tokens"):
        fit_request(registry, {"num_speculative_tokens": 99})


def test_no_model_named_the_default_runs_unless_it_cannot_then_the_first_that_can_with_a_note(registry):
    assert fit_request(registry, {}).settings == {"method": "draft_model"}              # the registry's default
    home = registry.models["pretrained"]
    fit = fit_request(registry, {}, home)
    assert fit.model == "pretrained" and fit.settings["method"] == "eagle" and fit.note is None
    fit = fit_request(registry, {"method": "draft_model"}, home)
    assert fit.model == "t-mha" and fit.settings == {"model": "t-mha", "method": "draft_model"}
    assert fit.note == "method=draft_model: no draft model shares pretrained's vocabulary, so t-mha runs it instead " \
                       "of pretrained"
    fit = fit_request(registry, {"num_kv_heads": 4, "method": "ngram"}, home)           # KV-head variants: ours
    assert fit.model == "t-mha" and fit.note.startswith("num_kv_heads=4: 4 is not available for pretrained")
    fit = fit_request(registry, {"method": "eagle"})                                     # only pretrained has one
    assert fit.model == "pretrained" and fit.settings["num_speculative_tokens"] == 5
    with pytest.raises(SettingsError, match="^method: t-mha has no medusa head"):      # nobody can: the default's
        fit_request(registry, {"method": "medusa"})


def test_a_demo_tree_is_filled_whole_for_eagle_and_only_where_no_part_of_its_shape_was_asked(registry, tmp_path):
    """bench heads may record a tree as a model's fastest drafting (demo.json): a request that leaves the drafting
    out gets its depth, top-k and budget together; one that names its depth, or another method, gets no tree."""
    import json

    from engine.model.threads import threads
    (tmp_path / "pretrained").mkdir()
    (tmp_path / "pretrained" / "demo.json").write_text(json.dumps({"by_threads": {str(threads()): {
        "num_speculative_tokens": 5, "draft_confidence_threshold": 0.0, "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8}}}))
    before, registry.heads_dir = registry.heads_dir, tmp_path
    try:
        tree = {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
        assert fit_request(registry, {"model": "pretrained"}).settings == {
            "model": "pretrained", "method": "eagle", "num_speculative_tokens": 5, "draft_confidence_threshold": 0.0,
            **tree}
        assert fit_request(registry, {"model": "pretrained", "method": "eagle", "max_tokens": 9}).settings.items() \
            >= tree.items()
        for asked in ({"num_speculative_tokens": 2}, {"method": "eagle", "speculative_eagle_topk": 2},
                      {"method": "ngram"}, {"method": "none"}):
            settings = fit_request(registry, {"model": "pretrained", **asked}).settings
            assert settings.items() >= asked.items(), settings
            assert not tree.items() <= settings.items(), settings
    finally:
        registry.heads_dir = before
