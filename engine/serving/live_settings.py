"""Settings changed while a session runs (`GenerationSession.update_settings`): validated at once, applied at
the next round boundary, where the session migrates what they touch (re-prefill, re-quantized cache, a new
proposer) and reports it as a SettingsApplied event with its cost."""
from __future__ import annotations


from ..kv.dtypes import kv_bytes_per_token
from ..kv.runner import ForwardRequest, PagedRunner
from ..spec_decode.proposers import DraftModelProposer
from .events import SettingsApplied
from .pools import PoolBudgetError
from .request_fit import unmet
from .settings import LIVE_SETTINGS, GenerationSettings, SettingsError

# the settings that choose a generation's KV pools, in the order an error over the KV memory budget names them
POOL_SETTINGS = ("kv_cache_dtype", "block_size", "num_kv_heads", "method", "kv_cache")


def pool_setting(asked: GenerationSettings | dict) -> str:
    """The setting to name when the pools of `asked` do not fit: for a change, the first of POOL_SETTINGS it
    changes; for a start, the cache dtype, block size or KV heads it sets away from their defaults, else `model`."""
    if isinstance(asked, dict):
        return next((name for name in POOL_SETTINGS if name in asked), next(iter(asked), "settings"))
    default = GenerationSettings()
    return next((name for name in POOL_SETTINGS[:3] if getattr(asked, name) != getattr(default, name)), "model")


class LiveSettings:
    """Mixed into GenerationSession (engine/serving/session.py), whose fields it reads and migrates."""

    def update_settings(self, changes: dict) -> GenerationSettings:
        """Validate now (raises SettingsError), apply at the next round boundary."""
        for name in sorted(set(changes) - LIVE_SETTINGS):
            if name not in GenerationSettings.model_fields:
                raise SettingsError(name, f"unknown setting; known: {', '.join(GenerationSettings.model_fields)}")
            if GenerationSettings.parse({name: changes[name]}, base=self.settings) != self.settings:
                raise SettingsError(name, "cannot change during a generation; start a new one")
        with self._pending_lock:
            merged = {**self._pending, **{k: v for k, v in changes.items() if k in LIVE_SETTINGS}}
            new = GenerationSettings.parse(merged, base=self.settings)
            if (why := unmet(self.engine.registry, self.target_lm, new)) is not None:
                raise why
            # the new settings' pools beside those in use (a cache moves from one pool to the other): held now, made
            # at the round boundary; over the budget, refused here and the generation runs on as it was
            self._claim_pools(pool_setting(changes), self.settings, *filter(None, [self._applying]), new)
            self._pending = merged
        return new

    def _claim_pools(self, setting: str, *settings: GenerationSettings) -> None:
        """Hold the pools these settings use, and only those (SettingsError naming `setting` if they do not fit)."""
        wants = {k: spec.nbytes for s in settings for k, spec in self.engine.pool_specs(self.target_lm, s).items()}
        try:
            self._pool_claim.set(wants)
        except PoolBudgetError as e:
            raise SettingsError(setting, str(e)) from None

    def _take_pending(self) -> GenerationSettings | None:
        """The settings changed since the last round (None if nothing changed), their KV pools made."""
        with self._pending_lock:
            changes, self._pending = self._pending, {}
            if not changes:
                return None
            new = self._applying = GenerationSettings.parse(changes, base=self.settings)
        self._ensure_pools(new)
        return new

    def _settle_pools(self, applied: GenerationSettings | None) -> None:
        """After a change is applied: the pools the old settings used are no longer held (idle, they may be freed)."""
        if applied is None:
            return
        with self._pending_lock:
            self._applying = None
            pending = [GenerationSettings.parse(self._pending, base=self.settings)] if self._pending else []
            self._claim_pools("settings", self.settings, *pending)       # fewer pools than held: never refused

    def _apply_pending(self, new: GenerationSettings | None):  # generator -> list[Event]
        if new is None:
            return []
        old = self.settings
        changed = {k: v for k, v in new.model_dump().items() if v != getattr(old, k)}
        if not changed:
            return []
        self.settings = new
        notes, t = [], self.clock.now()
        if "num_speculative_tokens" in changed:
            self.k = new.num_speculative_tokens
        if "enable_prefix_caching" in changed:
            for r in (self.target, getattr(self.proposer, "runner", None)):
                if isinstance(r, PagedRunner):
                    r.prefix_caching = new.enable_prefix_caching
        if {"num_kv_heads", "kv_cache"} & changed.keys() or (
                not new.kv_cache and {"kv_cache_dtype", "block_size"} & changed.keys()):
            if "num_kv_heads" in changed and new.num_kv_heads is not None:
                self.target_lm = self.variants[new.num_kv_heads]
            self.target.free()
            self.target = self._make_runner(self.target_lm)
            if new.kv_cache:
                yield ForwardRequest(self.target, self.tokens[:-1], last_only=True)   # may run in chunks
                self.features.record(self.target)
                self.target.commit()
                notes.append(f"target {self.target_lm.name} ({self.target_lm.cfg.attention_kind}) re-prefilled "
                             f"{len(self.tokens) - 1} tokens")
            else:
                self.target.token_ids = list(self.tokens[:-1])   # nothing to compute until the next step
                notes.append("KV cache off: every step recomputes the whole sequence")
            if isinstance(self.proposer, DraftModelProposer):
                self.proposer.free()
                self.proposer = self._make_proposer()
        elif {"kv_cache_dtype", "block_size"} & changed.keys() and isinstance(self.target, PagedRunner):
            for holder in (self, self.proposer):
                runner = getattr(holder, "target" if holder is self else "runner", None)
                if isinstance(runner, PagedRunner) and (holder is self or isinstance(holder, DraftModelProposer)):
                    lm = self.target_lm if holder is self else self.draft_lm
                    moved = runner.move_to(self.engine.manager(lm, new.kv_cache_dtype, new.block_size))
                    self._seq_ids.add((moved.manager.pool.name, moved.seq.seq_id))
                    if holder is self:
                        self.target = moved
                    else:
                        holder.runner = moved
            notes.append(f"KV cache re-quantized to {new.kv_cache_dtype}, block size {new.block_size}: "
                         f"{kv_bytes_per_token(self.target_lm.cfg, new.kv_cache_dtype):,} bytes/token")
        if {"method", "prompt_lookup_min", "prompt_lookup_max"} & changed.keys():
            if self.proposer is not None:
                self.proposer.free()
            self.proposer = self._make_proposer()
            notes.append(f"proposer: {new.method}")
        cost_ms = (self.clock.now() - t) * 1e3
        return [SettingsApplied(changed, notes, cost_ms)]

