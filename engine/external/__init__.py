"""Other engines: clients of OpenAI-compatible servers (vLLM, SGLang, llama.cpp) and the servers we embed.

Owns the streaming chat client that turns a server's chunks into our events (`openai_stream`), llama.cpp's
server run in-process (`llamacpp_server`), vLLM's server run beside it (`vllm_server`) and its speculative
steps read from its stream (`vllm_rounds`; the n-gram rule comes in from whoever configures the server, as
this room does not reach our engine), other servers' Prometheus metrics (`server_metrics`) and the race
between two engines (`engine_race`).

May import: the words it shares with our engine, engine.serving.events and engine.serving.settings; never
the numpy model (tests/test_architecture.py follows the imports through).
"""
