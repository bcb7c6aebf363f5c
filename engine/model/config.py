"""Model configuration: one dataclass with Hugging Face Llama field names and named presets."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """A Llama-style decoder (LlamaForCausalLM fields). head_dim defaults to hidden_size // heads."""

    hidden_size: int = 96
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 256
    vocab_size: int = 128
    max_position_embeddings: int = 512
    head_dim: int = 0  # 0 = derive in __post_init__
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for f in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim"):
            if int(getattr(self, f)) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def attention_kind(self) -> str:
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"

    def num_parameters(self) -> int:
        c, hd, i, v = self.hidden_size, self.head_dim, self.intermediate_size, self.vocab_size
        attn = c * hd * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attn + 3 * c * i + 2 * c
        head = 0 if self.tie_word_embeddings else v * c
        return v * c + self.num_hidden_layers * layer + c + head

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # --- Hugging Face config.json -------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}
        d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                 attention_bias=False, mlp_bias=False, torch_dtype="float16")
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "custom") -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"name"}
        required = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "vocab_size"}
        missing = sorted(required - d.keys())
        if missing:
            raise ValueError(f"missing fields {missing}")
        kwargs = {k: v for k, v in d.items() if k in known and v is not None}
        kwargs.setdefault("num_key_value_heads", d["num_attention_heads"])
        if isinstance(kwargs.get("eos_token_id"), list):  # some HF configs list several
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs, name=name)

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return cls(**PRESETS[name], name=name)


# Named presets. The "seed-*" ones have the sizes of the first seed article's models (its target:
# 4 layers x width 96 x 4 heads; its draft: 1 layer x 48 x 2 heads) in our Llama architecture.
PRESETS: dict[str, dict[str, Any]] = {
    "seed-target": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=4, intermediate_size=256, vocab_size=128,
                        max_position_embeddings=512),
    "seed-draft": dict(hidden_size=48, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                       max_position_embeddings=512),
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, vocab_size=64, max_position_embeddings=256),
    # The shipped family (engine/training, models/): character level over Python's stdlib (99 tokens).
    # 6 query heads of dim 32 so that 6 (MHA), 2 (GQA) and 1 (MQA) KV heads all divide them. A decode
    # step of models this small costs numpy's per-call overhead per layer more than arithmetic, so the
    # draft's cost relative to the target is set mostly by their layer counts: 6 target layers, one draft
    # layer. The draft's MLP width trades cost for acceptance: the 384-wide MLP is cheaper per step than a
    # 768-wide one for about the same greedy acceptance after distillation (c measured: `bench engine`).
    "target-mha": dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                       num_key_value_heads=6, intermediate_size=512, vocab_size=99,
                       max_position_embeddings=512, eos_token_id=0),
    "target-gqa": dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                       num_key_value_heads=2, intermediate_size=512, vocab_size=99,
                       max_position_embeddings=512, eos_token_id=0),
    "target-mqa": dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                       num_key_value_heads=1, intermediate_size=512, vocab_size=99,
                       max_position_embeddings=512, eos_token_id=0),
    "draft": dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=384, vocab_size=99, max_position_embeddings=512, eos_token_id=0),
    "ci-tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=64, vocab_size=99, max_position_embeddings=64, eos_token_id=0),
}
