"""The model: a Llama-style decoder in numpy and everything that gives it weights and words.

Owns the config dataclass and its presets (`config`), the forward pass (`llama`), the weight layouts that
stream a memory-bound model's weights at the speed of memory (`layout`) and the threads and helper processes
their products run on (`threads`, `product_processes`, `thread_choice`), checkpoints in Hugging Face's
layout (`checkpoint`), GGUF conversion (`gguf`), fetched pretrained models (`fetched`), tokenizers and chat
templates, a deliberately plain reference implementation (`reference`) and the loaded model a registry
holds (`loaded_model`).

May import: nothing else of engine/. Everything else stands on it.
"""
