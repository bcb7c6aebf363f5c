"""vLLM with suffix decoding, live (see test_vllm_suffix_cross_check.py)."""
