"""Settings arrive as text from forms, query strings and websocket messages; each must parse as its value."""
import pytest

from engine.serving.settings import GenerationSettings, SettingsError


def test_every_setting_accepts_its_value_as_text():
    s = GenerationSettings.parse({
        "max_tokens": "64", "temperature": "0.5", "top_p": "0.9", "seed": "7", "method": "ngram",
        "num_speculative_tokens": "6", "prompt_lookup_min": "2", "prompt_lookup_max": "3", "kv_cache": "false",
        "kv_cache_dtype": "int8", "num_kv_heads": "2", "block_size": "32", "enable_prefix_caching": "true",
    })
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.num_speculative_tokens) == (64, 0.5, 0.9, 7, 6)
    assert (s.block_size, s.num_kv_heads, s.kv_cache, s.enable_prefix_caching) == (32, 2, False, True)
    assert s.kv_cache_dtype == "int8_per_token_head"


@pytest.mark.parametrize("value", ["12", "sixteen", "16.5", ""])
def test_block_size_as_text_still_names_the_allowed_values(value):
    with pytest.raises(SettingsError, match="block_size"):
        GenerationSettings.parse({"block_size": value})
