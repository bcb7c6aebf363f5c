"""Generation settings, named as vLLM names them, validated with ranges that errors state.

`GenerationSettings.parse(dict)` raises `SettingsError` naming the setting and the allowed range;
form values that arrive as strings ("4", "true") are accepted. Which settings can change while a
generation runs is listed in LIVE_SETTINGS; the session applies them at the next round boundary.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ..kv.dtypes import resolve_kv_cache_dtype

MAX_PROMPT_CHARS = 8000
METHODS = ("none", "draft_model", "ngram", "eagle", "medusa", "suffix")   # vLLM's names; heads: engine/spec_decode/heads.py
SUFFIX_SETTINGS = ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                   "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")
FAULTS = ("none", "no_causal_mask", "no_truncate", "unnormalized_residual")
TREE_METHODS = ("eagle", "ngram", "medusa")   # the methods that can draft a token tree (speculative_eagle_topk > 1)
MAX_DRAFT_TOKENS = 64                # speculative_num_draft_tokens' top: the nodes one verification forward scores


EXCERPT_CHARS = 40


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """What an error message may echo of a client's value (docs/protocol.md): `repr(value)`, and when that is
    longer than `limit` characters, its first `limit` characters followed by "… (N characters)"."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def excerpt_name(name: str) -> str:
    """A field's or setting's name in an error: as it is, or as an excerpt when longer than 40 characters."""
    return name if len(name) <= EXCERPT_CHARS else excerpt(name)


class SettingsError(ValueError):
    def __init__(self, setting: str, message: str):
        self.setting = setting = excerpt_name(setting)
        super().__init__(f"{setting}: {message}")


class GenerationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(None, description="a model name from `decoding-playground models`")
    chat: bool = False
    max_tokens: int = Field(128, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, ge=0, le=2 ** 32 - 1)
    method: Literal["none", "draft_model", "ngram", "eagle", "medusa", "suffix"] = "draft_model"
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    num_speculative_tokens_schedule: Literal["constant", "heuristic", "acceptance", "batch"] = "constant"
    # token trees (SGLang's names; engine/spec_decode/eagle_tree.py): the children an expanded node gets (1: a chain
    # of num_speculative_tokens, its depth), and the nodes verified (None: num_speculative_tokens, a chain's count)
    speculative_eagle_topk: int = Field(1, ge=1, le=8, description="children per expanded node of a draft tree "
                                                                   "(1: a chain)")
    speculative_num_draft_tokens: int | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS,
                                                     description="the draft tree's nodes verified (the budget; "
                                                                 "default num_speculative_tokens)")
    draft_confidence_threshold: float = Field(0.0, ge=0.0, le=1.0)   # stop drafting below it (0: never)
    # how a chain is verified (vLLM's name): token by token, or as a block (engine/spec_decode/verify.py)
    rejection_sample_method: Literal["standard", "block"] = Field(
        "standard", description="standard (token by token) or block (Sun et al. 2024)")
    prompt_lookup_min: int = Field(1, ge=1, le=16)
    prompt_lookup_max: int = Field(4, ge=1, le=16)
    # suffix decoding (vLLM's names and defaults; engine/spec_decode/suffix.py): the trees' depth, the earlier
    # responses a global tree holds, the draft's length per matched token, the path probability it stops below
    suffix_decoding_max_tree_depth: int = Field(24, ge=1, le=64)
    suffix_decoding_max_cached_requests: int = Field(10000, ge=0, le=1_000_000)
    suffix_decoding_max_spec_factor: float = Field(1.0, ge=0.0, le=16.0)
    suffix_decoding_min_token_prob: float = Field(0.1, ge=0.0, le=1.0)
    kv_cache: bool = True
    kv_cache_dtype: str = "auto"
    num_kv_heads: int | None = Field(None, ge=1, le=64)
    block_size: Literal[8, 16, 32] = 16
    enable_prefix_caching: bool = True
    fault: Literal["none", "no_causal_mask", "no_truncate", "unnormalized_residual"] = "none"

    @field_validator("kv_cache_dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        return resolve_kv_cache_dtype(v).name

    @field_validator("model", mode="before")
    @classmethod
    def _empty_model(cls, v):
        return None if v in ("", None) else v

    @field_validator("num_kv_heads", "speculative_num_draft_tokens", mode="before")
    @classmethod
    def _empty_heads(cls, v):
        return None if v in ("", None) else v

    @field_validator("block_size", mode="before")
    @classmethod
    def _block_size_from_text(cls, v):
        """Form and query-string values arrive as text; a Literal of ints would refuse "16"."""
        return int(v) if isinstance(v, str) and v.strip().isdigit() else v

    @field_validator("prompt_lookup_max")
    @classmethod
    def _lookup_range(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("prompt_lookup_min", 1)
        if v < low:
            raise ValueError(f"must be >= prompt_lookup_min ({low})")
        return v

    @classmethod
    def parse(cls, data: dict[str, Any] | None = None, base: "GenerationSettings | None" = None,
              alone: bool = False):
        """Validate `data` (on top of `base`'s values); errors name the setting and the range. `alone`: each
        value's own range only, not a token tree's rules between settings (a URL's values, read one by one)."""
        values = base.model_dump() if base is not None else {}
        values.update(data or {})
        try:
            settings = cls.model_validate(values)
        except ValidationError as e:
            err = e.errors()[0]
            setting = ".".join(str(x) for x in err["loc"]) or "settings"
            if err["type"] == "extra_forbidden":
                raise SettingsError(setting, f"unknown setting; known: {', '.join(cls.model_fields)}") from None
            message = err["msg"].removeprefix("Value error, ")     # pydantic's prefix for a validator's ValueError
            if err["type"] in BOUND_ERRORS and setting in cls.model_fields:
                message = f"must be in {value_range(cls.model_fields[setting])}"
            raise SettingsError(setting, f"{message} (got {excerpt(err.get('input'))})") from None
        if not alone and (why := settings.tree_error()) is not None:
            raise why
        return settings

    @property
    def num_draft_tokens(self) -> int:
        """The draft tree's budget: speculative_num_draft_tokens, else num_speculative_tokens (a chain's count)."""
        return self.speculative_num_draft_tokens or self.num_speculative_tokens

    @property
    def drafts_tree(self) -> bool:
        return self.speculative_eagle_topk > 1

    def tree_error(self) -> SettingsError | None:
        """What a token tree's settings cannot be together (each value's own range is checked as any setting's)."""
        budget, depth = self.speculative_num_draft_tokens, self.num_speculative_tokens
        if budget is not None and budget < depth:
            return SettingsError("speculative_num_draft_tokens", f"must be in [num_speculative_tokens ({depth}), "
                                                                 f"{MAX_DRAFT_TOKENS}]: a tree holds at least its "
                                                                 f"depth's nodes (got {budget})")
        if not self.drafts_tree:
            return None
        topk = self.speculative_eagle_topk
        if self.method not in TREE_METHODS + ("none",):
            return SettingsError("speculative_eagle_topk", f"must be 1 (a chain) with method {self.method}: only "
                                                           f"{', '.join(TREE_METHODS)} draft trees (got {topk})")
        if self.rejection_sample_method != "standard":
            return SettingsError("rejection_sample_method", f"must be standard with a draft tree "
                                                            f"(speculative_eagle_topk {topk}): block verification "
                                                            f"verifies chains")
        if self.fault != "none":
            return SettingsError("fault", f"must be none with a draft tree (speculative_eagle_topk {topk}): the "
                                          f"teaching faults break a chain's round")
        return None


BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def value_range(field) -> str:
    """A numeric setting's range as an interval, e.g. `[1, 16]` or `(0, 1]`."""
    bounds = {name: getattr(m, name) for m in field.metadata for name in ("ge", "gt", "le", "lt") if hasattr(m, name)}
    low = f"[{bounds['ge']}" if "ge" in bounds else f"({bounds['gt']}" if "gt" in bounds else "(-inf"
    high = f"{bounds['le']}]" if "le" in bounds else f"{bounds['lt']})" if "lt" in bounds else "inf)"
    return f"{low}, {high}"


# Settings a running generation picks up at its next round; the rest need a new generation.
LIVE_SETTINGS = {"temperature", "top_p", "method", "num_speculative_tokens", "num_speculative_tokens_schedule",
                 "speculative_eagle_topk", "speculative_num_draft_tokens",
                 "rejection_sample_method",
                 "draft_confidence_threshold",
                 "prompt_lookup_min", "prompt_lookup_max", *SUFFIX_SETTINGS, "kv_cache", "kv_cache_dtype", "num_kv_heads",
                 "block_size", "enable_prefix_caching", "fault", "max_tokens"}
