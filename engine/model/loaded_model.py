"""A model as the engine serves it: its weights, config, tokenizer and what the page says about it."""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import ModelConfig
from .layout import choose_split_rows, weight_bytes
from .llama import Model
from .thread_choice import current_choice
from .tokenizer import TextTokenizer


@dataclass
class LoadedModel:
    name: str
    role: str                   # target | draft
    cfg: ModelConfig
    model: Model
    tokenizer: TextTokenizer
    path: str | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        # how its products run fastest for its shapes on this machine, measured once its weights are in memory
        # (a fetched model is measured when its weights load: engine/model/fetched.py)
        if isinstance(self.model, Model):
            choose_split_rows(self.model)

    def describe(self) -> dict:
        c = self.cfg
        # a loaded model in a layout for weights beyond the caches (engine/model/layout.py): its bytes, and how fast
        # one pass over them ran here (vars: a model not loaded yet is not loaded for this)
        floor = vars(self.model).get("weights_stream_ms")
        choice = current_choice()         # the pass on as many threads as its products run on (thread_choice.py)
        threads = choice.threads if floor is not None and choice is not None else 1
        if threads > 1 and threads in choice.read_ms:
            floor = choice.read_ms[threads]
        streamed = {} if floor is None else {"layout": self.model.layout, "weights_stream_ms": floor,
                                             "weight_bytes": weight_bytes(self.model), "threads": threads}
        return {"name": self.name, "role": self.role, "attention": c.attention_kind,
                "num_hidden_layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
                "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
                "head_dim": c.head_dim, "vocab_size": c.vocab_size,
                "max_position_embeddings": c.max_position_embeddings,
                "parameters": self.model.num_parameters, "path": self.path,
                "chat": self.tokenizer is not None and self.tokenizer.chat_template is not None, **streamed,
                **self.meta}
