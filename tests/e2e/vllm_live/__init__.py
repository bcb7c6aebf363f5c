"""vLLM itself, live (see conftest.py)."""
