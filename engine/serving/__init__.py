"""Serving: generation settings, sessions as generators of typed events, and the scheduler that batches them.

Owns the settings and their checks (`settings`), settings changed during a run (`live_settings`), the
events a session yields (`events`), a generation session (`session`, with its figures in
`session_figures`), the registry of models, drafts and heads an engine holds (`registry`), which model a request runs on and
what it gets for the settings it leaves out (`request_fit`), the scheduler
(continuous batching, chunked prefill; `scheduler`), vLLM-style counters (`metrics`) and jobs: engine work
in steps that a serving thread interleaves with generations (`jobs`).

May import: engine.model, engine.kv, engine.spec_decode.
"""
