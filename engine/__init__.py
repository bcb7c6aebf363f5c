"""The numpy inference engine, one package per concern, each importing only the rooms below it:

    model/        the Llama-style decoder, its weights, layouts, checkpoints, tokenizers, fetched models
    kv/           the paged KV cache (block pool, stores, dtypes, memory formulas) and the model run over it
    spec_decode/  sampling, verification, proposers and draft heads (EAGLE, Medusa)
    serving/      settings, sessions as generators of typed events, the registry, the scheduler, jobs
    external/     clients of other engines (OpenAI-compatible servers, embedded llama.cpp)
    experiments/  what the teaching views run: traces, races, the shoot-out, measurements, theory
    training/     numpy training with handwritten backprop, and the draft heads' training

NOTE: BLAS is pinned to one thread before numpy is first imported. OpenBLAS's second thread splits each
product into fixed halves and waits for both, so on a shared machine every product waits for a core another
process may hold, and steps and prefills become many times slower. More cores for a memory-bound model come
from `--threads N` (engine/model/threads.py), whose caller computes a late helper's share itself.
"""
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
