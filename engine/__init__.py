"""The numpy inference engine: model, paged KV cache, tokenizer and checkpoints.

NOTE: BLAS is pinned to one thread before numpy is first imported. On a shared 2-core machine a
second BLAS thread has made decode steps 10-25x slower (docs/benchmarks.md). Set the variables
yourself before importing numpy to override.
"""
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
