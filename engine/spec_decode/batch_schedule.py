"""`num_speculative_tokens_schedule: "batch"`: γ by the number of sessions running on the model, vLLM's dynamic
speculative decoding (`num_speculative_tokens_per_batch_size`, vllm/v1/spec_decode/dynamic/utils.py).

A table is a list of inclusive ranges of batch sizes, each with its γ: `[[1, 3, 4], [4, 15, 2], [16, 16, 0]]`.
vLLM's rules: the first range starts at 1, ranges are sorted and do not overlap, a gap carries the γ before it, the
sizes past the last range carry the last γ, and no γ exceeds the `num_speculative_tokens` setting.

Why by load: one session's decode step reads every weight once for one row, so a few rows more (a verification)
cost little; a batch of many sessions already reads them for many rows, and its step grows with every row added.
Past some number of sessions the rows a verification adds cost more than the tokens it saves, and γ = 0 (no
speculation) is fastest (the architecture notes' facts about speed; the measured tables: docs/benchmarks.md,
`bench serve --sweep`). `bench serve --sweep --method M` measures a model's table for a method and stores it in
models/batch_schedules/MODEL.json; a model or method measured by no sweep drafts at the γ as set, and says so.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

TABLES_DIR = Path(__file__).resolve().parents[2] / "models" / "batch_schedules"
TABLE_KEY = "num_speculative_tokens_per_batch_size"     # vLLM's name for the table


def validated_table(entries) -> list[tuple[int, int, int]]:
    """`entries` as vLLM checks them: a non-empty list of (range_start, range_end, num_speculative_tokens), starts
    from 1, positive, non-overlapping; sorted by start. ValueError naming the table otherwise."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"{TABLE_KEY} must be a non-empty list of (range_start, range_end, num_speculative_tokens)")
    table = []
    for e in entries:
        if not isinstance(e, (list, tuple)) or len(e) != 3:
            raise ValueError(f"{TABLE_KEY}: each entry is (range_start, range_end, num_speculative_tokens), got {e!r}")
        start, end, k = (int(x) for x in e)
        if not 1 <= start <= end or k < 0:
            raise ValueError(f"{TABLE_KEY}: need 1 <= range_start <= range_end and num_speculative_tokens >= 0, "
                             f"got {e!r}")
        table.append((start, end, k))
    table.sort()
    if table[0][0] != 1:
        raise ValueError(f"{TABLE_KEY}: the first range must start at 1, so that every batch size has a γ")
    if any(b[0] <= a[1] for a, b in zip(table, table[1:])):
        raise ValueError(f"{TABLE_KEY}: ranges must not overlap")
    return table


def entry_for(table: list[tuple[int, int, int]], batch_size: int) -> tuple[int, int, int]:
    """The range that decides `batch_size`: the one holding it, else (a gap, or past the end) the last before it."""
    return [e for e in table if e[0] <= max(1, batch_size)][-1]


def num_speculative_tokens_for(table: list[tuple[int, int, int]], batch_size: int, k: int) -> int:
    """γ at `batch_size` running sessions, at most `k` (the setting): vLLM's dense lookup, one size at a time."""
    return min(k, entry_for(table, batch_size)[2])


def table_from_sweep(best: dict[int, int]) -> list[list[int]]:
    """A table from a sweep's fastest γ per measured concurrency ({concurrency: γ}, 0: no speculation fastest):
    each measured concurrency's γ holds from it up to the next one measured, the last one's from it on (vLLM
    carries the last range's γ past its end)."""
    cs = sorted(best)
    if not cs:
        raise ValueError("no concurrency measured")
    starts = [1, *cs[1:]]
    return [[s, (cs[i + 1] - 1) if i + 1 < len(cs) else max(cs[-1], s), int(best[c])]
            for i, (s, c) in enumerate(zip(starts, cs))]


def fastest_gamma(tokens_per_s: dict) -> int:
    """The γ of the highest tokens/s among a concurrency's cells ({γ or "none": tokens/s}); "none" is 0. A failed
    cell (None) never wins."""
    ok = {g: t for g, t in tokens_per_s.items() if t}
    if not ok:
        raise ValueError("every cell failed")
    g = max(ok, key=ok.get)
    return 0 if g == "none" else int(g)


def load_table(model: str, method: str, tables_dir: Path | None = None) -> dict | None:
    """A model's stored table for `method` (in tables_dir, default TABLES_DIR): {"table": validated ranges,
    "measured": where from}; None without one."""
    try:
        data = json.loads((Path(tables_dir or TABLES_DIR) / f"{model}.json").read_text())
        entry = data["by_method"][method]
        return {"table": validated_table(entry[TABLE_KEY]), "measured": str(entry.get("measured", ""))}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_table(model: str, method: str, table: list, measured: str, tables_dir: Path | None = None) -> Path:
    """Write `table` for (model, method) into tables_dir/MODEL.json, keeping the other methods' tables."""
    f = Path(tables_dir or TABLES_DIR) / f"{model}.json"
    data = json.loads(f.read_text()) if f.is_file() else {"by_method": {}}
    data["by_method"][method] = {TABLE_KEY: [list(e) for e in validated_table(table)], "measured": measured}
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(re.sub(r"\[\s+(\d+),\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2, \3]", json.dumps(data, indent=1)) + "\n")
    return f


class BatchSchedule:
    """γ from the table at the number of sessions running on the model (`running()`), looked up before every
    round. Without a table (`measured` None), γ as set. Its report says which range decided, and when γ is 0,
    that verification no longer pays at this load."""
    name = "batch"

    def __init__(self, k: int, table: dict | None, running: Callable[[], int]):
        self.setting, self.measured, self.running = k, table, running
        self.batch_size = 1
        self.k = self._lookup()

    def _lookup(self) -> int:
        self.batch_size = max(1, int(self.running()))
        if self.measured is None:
            return self.setting
        return num_speculative_tokens_for(self.measured["table"], self.batch_size, self.setting)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.k = self._lookup()

    def report(self) -> dict:
        """For the status line: `why` off (γ 0 at this load) | table (γ from the table) | unmeasured (no table:
        γ as set); the batch size, the range that decided and where the table was measured."""
        if self.measured is None:
            return {"schedule": self.name, "why": "unmeasured", "batch_size": self.batch_size, "range": None,
                    "measured": None}
        start, end, _ = entry_for(self.measured["table"], self.batch_size)
        return {"schedule": self.name, "why": "off" if self.k == 0 else "table", "batch_size": self.batch_size,
                "range": [start, end], "measured": self.measured["measured"]}
