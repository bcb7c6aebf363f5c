"""Prompt presets: each shows off one mechanism. Our models are character level over Python's stdlib."""

PRESETS = [
    {
        "id": "code",
        "label": "Code · draft model",
        "hint": "A small draft model proposes γ characters, the target checks them all in one forward.",
        "prompt": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "settings": {"method": "draft_model", "num_speculative_tokens": 4, "temperature": 0, "kv_cache": True},
    },
    {
        "id": "repetitive",
        "label": "Repetitive text · n-gram lookup",
        "hint": "Prompt lookup proposes what followed the last occurrence of the current n-gram: free drafts.",
        "prompt": ("import os\nimport sys\nimport re\n\n"
                   "for name in os.listdir(path):\n    print(name)\n"
                   "for name in os.listdir(path):\n    print(name)\n"
                   "for name in os.listdir(path):\n"),
        "settings": {"method": "ngram", "num_speculative_tokens": 6, "temperature": 0, "kv_cache": True},
    },
    {
        "id": "prefix",
        "label": "Long shared prefix · prefix caching",
        "hint": "Press play twice: the second run finds the prompt's full blocks in the prefix cache.",
        "prompt": ('"""Utilities for reading and writing configuration files.\n\n'
                   "This module provides a small set of helpers that parse configuration files,\n"
                   "validate their sections and values, and write them back in a stable order so\n"
                   "that two runs of the same program produce identical files.\n"
                   '"""\n\nimport os\n\n\ndef read_config(path):\n'),
        "settings": {"method": "none", "enable_prefix_caching": True, "block_size": 16, "kv_cache": True},
    },
    {
        "id": "nocache",
        "label": "No KV cache · watch it slow down",
        "hint": "Without a cache every step recomputes the whole sequence: the latency chart climbs.",
        "prompt": "class Stack:\n    def __init__(self):\n",
        "settings": {"method": "none", "kv_cache": False, "max_tokens": 256},
    },
    {
        "id": "memory",
        "label": "MQA + int8 · KV bytes per token",
        "hint": "One KV head instead of six, one byte per number: watch bytes per token and blocks.",
        "prompt": "def parse_args(argv):\n",
        "settings": {"method": "draft_model", "num_kv_heads": 1, "kv_cache_dtype": "int8_per_token_head"},
    },
]

DEFAULT_PROMPT = PRESETS[0]["prompt"]
