"""Settings changed while a session runs (`GenerationSession.update_settings`): validated at once, held until
the next round boundary, where the session migrates what they touch (engine/serving/session.py) and reports it
as a SettingsApplied event with its cost. Meanwhile the KV pools they need are claimed against the server's KV
memory budget, so that a change that cannot fit is refused when it is sent and the generation runs on as it was."""
from __future__ import annotations

import threading

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
    """One generation's pending settings changes and the KV pools it holds.

    NOTE: `update` may be called from any thread; `take` and `settle` only from the generation's own, at round
    boundaries. The pools held are always those of the settings in use, of a change being applied and of the
    changes pending; `claim` holds them (engine/serving/pools.py) until the generation releases it."""

    def __init__(self, engine):
        self.engine = engine
        self.claim = engine.pools.claim()
        self._pending: dict = {}
        self._applying: GenerationSettings | None = None
        self._lock = threading.Lock()

    def update(self, changes: dict, current: GenerationSettings, target) -> GenerationSettings:
        """Validate `changes` to `current` (raises SettingsError) and hold them for the next round boundary."""
        for name in sorted(set(changes) - LIVE_SETTINGS):
            if name not in GenerationSettings.model_fields:
                raise SettingsError(name, f"unknown setting; known: {', '.join(GenerationSettings.model_fields)}")
            if GenerationSettings.parse({name: changes[name]}, base=current) != current:
                raise SettingsError(name, "cannot change during a generation; start a new one")
        with self._lock:
            merged = {**self._pending, **{k: v for k, v in changes.items() if k in LIVE_SETTINGS}}
            new = GenerationSettings.parse(merged, base=current)
            if (why := unmet(self.engine.registry, target, new)) is not None:
                raise why
            # the new settings' pools beside those in use (a cache moves from one pool to the other): held now, made
            # at the round boundary; over the budget, refused here and the generation runs on as it was
            self.hold(pool_setting(changes), target, current, *filter(None, [self._applying]), new)
            self._pending = merged
        return new

    def hold(self, setting: str, target, *settings: GenerationSettings) -> None:
        """Hold the pools these settings use, and only those (SettingsError naming `setting` if they do not fit)."""
        wants = {k: spec.nbytes for s in settings for k, spec in self.engine.pool_specs(target, s).items()}
        try:
            self.claim.set(wants)
        except PoolBudgetError as e:
            raise SettingsError(setting, str(e)) from None

    def take(self, current: GenerationSettings, target) -> GenerationSettings | None:
        """The settings changed since the last round (None if nothing changed), their KV pools made: writing a
        pool's memory is part of no forward and of no settings change's cost."""
        with self._lock:
            changes, self._pending = self._pending, {}
            if not changes:
                return None
            new = self._applying = GenerationSettings.parse(changes, base=current)
        self.engine.prepare_pools_for(target, new)
        return new

    def settle(self, applied: GenerationSettings | None, current: GenerationSettings, target) -> None:
        """After a change is applied: the pools the old settings used are no longer held (idle, they may be freed)."""
        if applied is None:
            return
        with self._lock:
            self._applying = None
            pending = [GenerationSettings.parse(self._pending, base=current)] if self._pending else []
            self.hold("settings", target, current, *pending)       # fewer pools than held: never refused
