"""The KV block map: every block of the target's and the drafter's pools as a cell, sent as what changed.

A pool is drawn in segments of KV_SEGMENT blocks: a round changes a few neighbouring blocks, and one segment
is one swapped element (htmx's work per message grows with the square of its top-level elements, see
templates/_fragments.html); a whole pool is a few hundred blocks.

A round that verifies a token tree also draws the tree's scratch slots in the target's cache (`kv_tree_html`,
from the kv event's `tree`): written one by one, then every slot off the accepted path freed.

NOTE (invariants): `KvMap` remembers each role's last drawn state (block letters, the sequence's blocks) and
sends only the changed segments; a pool seen for the first time (or another dtype / block size) is sent whole.
"""
from __future__ import annotations

from dataclasses import dataclass

from markupsafe import escape

from app.views.templating import macros

STATE_LETTERS = {"f": "free", "c": "cached", "u": "used", "s": "shared"}
KV_SEGMENT = 32
FULL_GRID_ABOVE = 4            # more changed segments than this: send the whole grid in one element


def kv_cell_html(c: dict) -> str:
    """One KV block cell. Built here rather than by a template macro: a whole pool is hundreds of cells (a
    macro call each was most of the time spent drawing the KV map)."""
    event = f' data-event="{escape(c["event"])}"' if c["event"] else ""
    mine = ' data-mine="1"' if c["mine"] else ""
    return f'<i class="kv" data-kv-block="{int(c["id"])}" data-state="{escape(c["state"])}"{event}{mine}></i>'


def kv_segment_html(role: str, k: int, cells: list, oob: bool = False) -> str:
    """Segment `k` of a pool: KV_SEGMENT cells in a wrapper that takes no part in layout (CSS
    display: contents), so that a change is one swapped element whatever the number of its blocks."""
    attrs = ' hx-swap-oob="true"' if oob else ""
    return (f'<span id="kv-{escape(role)}-s{int(k)}"{attrs} class="kv-seg">'
            + "".join(kv_cell_html(c) for c in cells) + "</span>")


def kv_grid_html(role: str, pool: dict, cells: list) -> str:
    """A whole pool: every cell, in segments."""
    segments = "".join(kv_segment_html(role, k, cells[k * KV_SEGMENT:(k + 1) * KV_SEGMENT])
                       for k in range((len(cells) + KV_SEGMENT - 1) // KV_SEGMENT))
    return (f'<div id="kv-{escape(role)}-grid" hx-swap-oob="true" class="kv-grid" data-pool="{escape(pool["name"])}" '
            f'data-kv-cache-dtype="{escape(pool["kv_cache_dtype"])}" data-block-size="{escape(pool["block_size"])}">'
            + segments + "</div>")


def kv_tree_html(tree: dict | None) -> str:
    """A token tree's round in the target's cache (a kv event's `tree`, engine/serving/session_figures.py): its
    scratch slots in row order (the root, then the nodes), a gap where a block begins. CSS fills them one by one
    (by `data-row`: the verification forward wrote them), then turns those off the accepted path (`data-freed`)
    free once all are written (`data-rows`): keyframes, which run on a swapped element; attributes, not inline
    styles, which the page's CSP refuses. None: the element, hidden."""
    if tree is None:
        return '<div id="kv-tree" hx-swap-oob="true" class="kv-tree" hidden></div>'
    rows, start = tree["rows"], tree["start"]
    kept = [r for r in rows if r["kept_at"] is not None]
    moved = sum(1 for r in kept if r["kept_at"] != r["position"])
    blocks = sorted({r["block_id"] for r in rows})
    cells = []
    for i, r in enumerate(rows):
        what = "the root" if r["node"] is None else f"node {r['node']}"
        fate = (f"kept at position {r['kept_at']}" + (" (moved)" if r["kept_at"] != r["position"] else "")
                if r["kept_at"] is not None else "off the accepted path: freed")
        mark = (f' data-kept-at="{int(r["kept_at"])}"' if r["kept_at"] is not None
                else f' data-freed data-rows="{len(rows)}"')
        gap = " data-block-start" if i and r["offset"] == 0 else ""
        cells.append(f'<i class="kv-slot" data-row="{int(r["row"])}" data-position="{int(r["position"])}" '
                     f'data-block="{int(r["block_id"])}"{mark}{gap} '
                     f'title="{escape(what)}: position {int(r["position"])}, block {int(r["block_id"])} slot '
                     f'{int(r["offset"])}; {escape(fate)}"></i>')
    freed_blocks = tree.get("freed_blocks") or []
    caption = (f"This round's token tree: {len(rows)} scratch slots (the root and {len(rows) - 1} nodes) at positions "
               f"{start}–{start + len(rows) - 1}, block{'s' if len(blocks) > 1 else ''} "
               f"{', '.join(map(str, blocks))}; the accepted path's {len(kept)} kept at {start}–{start + len(kept) - 1}"
               + (f" ({moved} moved)" if moved else "") + f", {len(rows) - len(kept)} freed"
               + (f", and with them block{'s' if len(freed_blocks) > 1 else ''} {', '.join(map(str, freed_blocks))}"
                  if freed_blocks else ""))
    return (f'<div id="kv-tree" hx-swap-oob="true" class="kv-tree" data-start="{int(start)}" data-rows="{len(rows)}" '
            f'data-kept="{len(kept)}" data-freed-blocks="{" ".join(map(str, freed_blocks))}">'
            f'<p class="kv-caption">{escape(caption)}</p>'
            f'<div class="kv-slots">{"".join(cells)}</div></div>')


@dataclass
class RenderedPool:
    key: tuple                  # (pool name, kv_cache_dtype, block_size): one KV cache manager
    states: str
    table: frozenset
    pool: dict


class KvMap:
    def __init__(self):
        self.drawn: dict[str, RenderedPool] = {}
        self.tree_shown = False             # the last round drawn verified a token tree (`kv-tree` is shown)

    def clear(self) -> None:
        self.drawn.clear()

    def render(self, frame, pool_now, external: bool) -> None:
        """Into `frame.replace`: what changed in the pools of `frame`'s kv events (or all of them after the
        run: `frame.kv_snapshot`, when `pool_now(key)` gives their current state)."""
        pools: dict[str, dict] = {}
        if frame.kv_events:
            # the drafter's pool (a draft model's, or an EAGLE head's own) is drawn in the draft slot, under its name
            pools = {("draft" if p["role"] == "eagle" else p["role"]): p for p in frame.kv_events[-1].pools}
        freed: dict[str, RenderedPool] = {}       # drawn pools the server has freed since (an idle pool may go)
        if frame.kv_snapshot or frame.kv_events:
            for role, old in self.drawn.items():
                if role not in pools or frame.kv_snapshot:
                    snap = pool_now(old.key)
                    if snap is not None and (role not in pools or frame.kv_snapshot):
                        pools[role] = snap
                    elif snap is None and frame.kv_snapshot:
                        pools.pop(role, None)
                        freed[role] = old
        last_event: dict[tuple, str] = {}
        for e in frame.kv_events:
            for be in e.events:
                last_event[(be["pool"], be["block_id"])] = be["kind"]
        tree = next((e.tree for e in reversed(frame.kv_events) if e.tree), None)
        if tree is not None or (self.tree_shown and frame.kv_events):      # a chain's round hides it again
            frame.replace["kv-tree"] = kv_tree_html(tree)
            self.tree_shown = tree is not None
        m = macros()
        for role in ("target", "draft"):
            pool = pools.get(role)
            if pool is None:
                if role in freed:
                    gone = freed[role].pool
                    frame.replace[f"kv-{role}-grid"] = m.kv_unused(role, (
                        f"The pool {gone['name']} ({gone['kv_cache_dtype']}, block size {gone['block_size']}) has been "
                        "freed: no run uses it, and the server frees idle pools to make room for others"))
                    frame.replace[f"kv-{role}-caption"] = m.kv_caption(role, None)
                    self.drawn.pop(role, None)
                elif role in self.drawn or not self.drawn:
                    why = (" (an external engine: its KV cache is the server's own, not shown here)" if external
                           else " (method: no drafter with a cache)" if role == "draft" else " (KV cache off: recomputing)")
                    frame.replace[f"kv-{role}-grid"] = m.kv_unused(role, f"No {role} KV cache in use" + why)
                    frame.replace[f"kv-{role}-caption"] = m.kv_caption(role, None)
                    self.drawn.pop(role, None)
                continue
            key = (pool["name"], pool["kv_cache_dtype"], pool["block_size"])
            states, table = pool["block_states"], frozenset(pool["block_table"])
            old = self.drawn.get(role)
            cells = []
            full = old is None or old.key != key
            for i, letter in enumerate(states):
                mine = i in table
                ev = last_event.get((pool["name"], i)) if not full else None
                if not full and ev is None and old.states[i] == letter and ((i in old.table) == mine):
                    continue
                if ev is None and not full and old.states[i] != letter:
                    ev = _transition(old.states[i], letter)
                cells.append({"id": i, "state": STATE_LETTERS[letter], "event": ev, "mine": mine})
            if full:
                frame.replace[f"kv-{role}-grid"] = kv_grid_html(role, pool, cells)
            elif cells:            # the changed segments whole, with this frame's events on the changed cells
                segments = sorted({c["id"] // KV_SEGMENT for c in cells})
                changed = {c["id"]: c for c in cells}
                cells = [changed.get(i) or {"id": i, "state": STATE_LETTERS[s], "event": None, "mine": i in table}
                         for i, s in enumerate(states)]
                if len(segments) > FULL_GRID_ABOVE:
                    frame.replace[f"kv-{role}-grid"] = kv_grid_html(role, pool, cells)
                else:
                    for k in segments:
                        segment = cells[k * KV_SEGMENT:(k + 1) * KV_SEGMENT]
                        frame.replace[f"kv-{role}-s{k}"] = kv_segment_html(role, k, segment, oob=True)
            if full or frame.kv_snapshot:      # not every round: each top-level element costs the browser
                frame.replace[f"kv-{role}-caption"] = m.kv_caption(role, pool)
            self.drawn[role] = RenderedPool(key, states, table, pool)


def _transition(old: str, new: str) -> str | None:
    """The block event a change of state implies, when the engine reported none (e.g. after close)."""
    if new in "fc" and old in "us":
        return "free"
    if new == "u" and old in "fc":
        return "cache_hit" if old == "c" else "allocate"
    if new == "s":
        return "share"
    if new == "c" and old == "f":
        return "cache"
    return None
