"""What a session reports: its KV blocks each round, its metrics, and its summary at the end."""
from __future__ import annotations

from ..kv.dtypes import kv_bytes_per_token
from ..kv.runner import PagedRunner
from ..spec_decode.heads import EagleProposer
from .events import KVBlocks


class SessionFigures:
    """Mixed into GenerationSession (engine/serving/session.py), whose fields it reads."""

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    def _drain_block_events(self) -> list[dict]:
        """Take this session's block events from the pools it uses; other sessions' stay for them. (A copy of
        the pools: another thread may add one meanwhile.)"""
        return [{"kind": e.kind, "block_id": e.block_id, "pool": e.pool}
                for mgr in list(self.engine.managers.values()) for e in mgr.pool.drain_events(self._seq_ids)]

    def _kv_event(self) -> KVBlocks:
        pools = []
        drafter = "eagle" if isinstance(self.proposer, EagleProposer) else "draft"    # a head's pool is its own
        for role, runner in (("target", self.target), (drafter, getattr(self.proposer, "runner", None))):
            if isinstance(runner, PagedRunner):
                pools.append(runner.manager.snapshot().drawn(role, runner.seq.block_table))
        return KVBlocks(self._drain_block_events(), pools)

    def kv_figures(self) -> dict:
        s, cfg = self.settings, self.target_lm.cfg
        bpt = kv_bytes_per_token(cfg, s.kv_cache_dtype) if s.kv_cache else 0
        held = self.target.num_tokens if s.kv_cache else 0
        blocks = len(self.target.seq.blocks) if isinstance(self.target, PagedRunner) else 0
        return {"dtype": s.kv_cache_dtype if s.kv_cache else "none", "num_kv_heads": cfg.num_key_value_heads,
                "block_size": s.block_size, "bytes_per_token": bpt, "bytes_used": held * bpt,
                "blocks_allocated": blocks, "bytes_allocated": blocks * s.block_size * bpt}

    def draft_kv_bytes(self) -> int | None:
        """Bytes held by the drafter's own cache (a draft model's or the EAGLE head's: the draft pool); None
        when the drafter keeps none (n-gram lookup, Medusa, plain decoding)."""
        runner = getattr(self.proposer, "runner", None)
        return runner.num_tokens * runner.manager.bytes_per_token if isinstance(runner, PagedRunner) else None

    def metrics(self) -> dict:
        """kv_cache_bytes, kv_bytes_per_token and kv_blocks_used are the target's (the contract's kv_cache);
        draft_kv_cache_bytes the draft pool's, beside them."""
        m = self.stats.summary(self.num_output_tokens)
        kv = self.kv_figures()
        m.update(kv_cache_bytes=kv["bytes_used"], kv_bytes_per_token=kv["bytes_per_token"],
                 kv_blocks_used=kv["blocks_allocated"], draft_kv_cache_bytes=self.draft_kv_bytes(),
                 num_output_tokens=self.num_output_tokens, num_speculative_tokens=self.k)
        return m

    def summary(self) -> dict:
        out_ids = self.tokens[len(self.prompt_ids):]
        cfg = self.target_lm.cfg
        m = self.stats.summary(self.num_output_tokens)
        return {
            "text": self.tokenizer.decode(out_ids), "num_output_tokens": len(out_ids),
            "finish_reason": self.finish_reason,
            "tokens": [{**t, "text": text} for t, text in   # stream pieces: joined, they are `text`
                       zip(self.stats.token_statuses(self.tokenizer, out_ids), self.tokenizer.stream_texts(out_ids))],
            **m, "kv_cache": self.kv_figures(),
            "model": {"name": self.target_lm.name, "num_hidden_layers": cfg.num_hidden_layers,
                      "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
                      "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                      "vocab_size": cfg.vocab_size},
            "draft_model": self.draft_lm.name if self.draft_lm and self.settings.method == "draft_model" else None,
            "settings": self.settings.model_dump(),
        }
