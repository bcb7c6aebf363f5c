"""What the page's view (app/views/html.py) reads besides the events, and what one outgoing message holds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from engine.kv.cache import PoolSnapshot
from engine.serving.registry import ModelRegistry


@dataclass
class ViewSources:
    """What the page's view reads besides the events: the models (for the form's choices) and the KV pools
    as they are now (drawn after a run has freed its blocks)."""
    registry: ModelRegistry | None = None
    external: Mapping[str, object] = field(default_factory=dict)   # the external engines by name
    pools: Callable[[], list[PoolSnapshot]] = list


@dataclass
class Frame:
    """What one outgoing message will hold."""
    replace: dict = field(default_factory=dict)          # element id -> html (the latest wins)
    appends: dict = field(default_factory=dict)          # target id -> [html] in order
    kv_events: list = field(default_factory=list)
    kv_snapshot: bool = False
    metrics: dict | None = None
    chart: list = field(default_factory=list)            # packed latency-chart points of this message
    lane: dict | None = None                             # the draft lane to draw (once, after the last round)

    def append(self, target: str, html: str) -> None:
        self.appends.setdefault(target, []).append(html)
