"""The paged KV cache, and the model run over it.

Owns the block pool (metadata only: ids, reference counts, prefix hashes; `block_pool`), the per-model
cache manager and its stores (`cache`), the cache dtypes and their bytes (`dtypes`), the memory formulas of
public model configs and paging waste (`memory`), and the runners that run a model's forward over a
sequence's blocks or recompute it without a cache (`runner`).

May import: engine.model.
"""
