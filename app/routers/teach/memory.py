"""`GET /teach/memory`: the KV memory calculator on public configs (engine/kv/memory.py), beside our models."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.deps import PlaygroundDep
from app.routers.teach.common import fragment, number
from engine.experiments.theory import ACCELERATORS
from engine.kv.dtypes import KV_CACHE_DTYPES, kv_bytes_per_token
from engine.kv.memory import PUBLIC_CONFIGS, WEIGHT_BYTES_PER_PARAMETER, calculator

router = APIRouter()

MEMORY_PRESETS = [
    {"label": "Qwen3-8B, 32,768 tokens × 16 sequences", "note": "first seed: 72 GiB",
     "values": {"config": "Qwen3-8B", "context": 32768, "sequences": 16, "dtype": "bfloat16", "draft": ""}},
    {"label": "Llama-3.1-8B + Llama-3.2-1B draft, 8,192 tokens, fp16", "note": "second seed: 1 GiB + 256 MiB",
     "values": {"config": "Llama-3.1-8B", "context": 8192, "sequences": 1, "dtype": "float16",
                "draft": "Llama-3.2-1B"}},
    {"label": "gpt-oss-20b, 131,072 tokens", "note": "first seed: ≈ 3.0 GiB (sliding layers hold 128)",
     "values": {"config": "gpt-oss-20b", "context": 131072, "sequences": 1, "dtype": "bfloat16", "draft": ""}},
    {"label": "Qwen2.5-72B-Instruct, 32,768 tokens × 8", "note": "",
     "values": {"config": "Qwen2.5-72B-Instruct", "context": 32768, "sequences": 8, "dtype": "bfloat16",
                "draft": ""}},
]
MEMORY_DTYPES = ["bfloat16", "float16", "fp8_e4m3", "int8_per_token_head", "float32"]


@router.get("/memory", response_class=HTMLResponse)
def memory(request: Request, playground: PlaygroundDep, config: str = "Qwen3-8B", context: str = "32768",
           sequences: str = "16", dtype: str = "bfloat16", draft: str = "") -> HTMLResponse:
    """The form's names are not the generation settings' (`config`, `dtype`): the page has its own `model`."""
    model, kv_cache_dtype = config, dtype
    problems = []
    if model not in PUBLIC_CONFIGS:
        problems.append(f"model: one of {', '.join(PUBLIC_CONFIGS)}")
        model = "Qwen3-8B"
    if draft and draft not in PUBLIC_CONFIGS:
        problems.append(f"draft: one of {', '.join(PUBLIC_CONFIGS)}")
        draft = ""
    if kv_cache_dtype not in MEMORY_DTYPES:
        problems.append(f"kv_cache_dtype: one of {', '.join(MEMORY_DTYPES)}")
        kv_cache_dtype = "bfloat16"
    n = number(context, None, int, 1, 1_048_576)
    if n is None or str(n) != context.strip():
        problems.append("context: 1 to 1,048,576 tokens")
    context = n or 32768
    n = number(sequences, None, int, 1, 4096)
    if n is None or str(n) != sequences.strip():
        problems.append("sequences: 1 to 4,096")
    sequences = n or 1
    r = calculator(model, context, sequences, kv_cache_dtype, draft or None)
    cfg = PUBLIC_CONFIGS[model]
    ours = []
    if playground.registry is not None:
        dtype = "auto" if kv_cache_dtype == "float32" else kv_cache_dtype
        for lm in playground.registry.targets:
            c = lm.cfg
            ours.append({"name": lm.name, "layers": c.num_hidden_layers, "kv_heads": c.num_key_value_heads,
                         "head_dim": c.head_dim, "dtype": KV_CACHE_DTYPES[dtype],
                         "bytes_per_token": kv_bytes_per_token(c, dtype)})
    return fragment(request, "memory", r=r, cfg=cfg, weight_bytes_per_parameter=WEIGHT_BYTES_PER_PARAMETER,
                    configs=PUBLIC_CONFIGS, dtypes=MEMORY_DTYPES, presets=MEMORY_PRESETS, problems=problems,
                    accelerators=ACCELERATORS.values(), ours=ours, draft_cfg=PUBLIC_CONFIGS.get(draft))
