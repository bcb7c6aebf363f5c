"""Token trees beside chains in `bench heads` (cli/bench/heads.py): the shapes it measures, each tree's figures
against plain decoding and against the best chain of its method in the same interleaved run, the targets of the
trees, and the demo's drafting chosen from what was measured fastest (models/heads/NAME/demo.json, which
engine/spec_decode/heads.py's `demo_settings` reads).

A shape is SGLang's three settings: the depth (num_speculative_tokens), the children per expanded node
(speculative_eagle_topk) and the nodes verified (speculative_num_draft_tokens, the budget). A chain is top-1
with as many nodes as its depth. A row here is one setting's figures from cli/bench/smollm2.py's `against_plain`:
its method, gamma (the depth), confidence, topk and budget, its mean acceptance length, its in-run verification
cost v (t(verify)/t(1)), its measured decode speed-up over plain decoding (`measured`), whether its output was
plain decoding's (`identical`) and its H100 projection (`h100_projected`).
"""
from __future__ import annotations

import json
from pathlib import Path

# (depth, topk, budget) per method: budgets of 8 and 16 nodes (9 and 17 rows to verify) at top-2 to top-4.
# EAGLE's are EAGLE-2 dynamic trees, each budget's first the top-k and depth that `train-heads ... eval --trees`
# estimates best offline for the shipped head, the second a narrower one; Medusa's are the best paths of its
# heads' top-k (it has 4 heads: depth <= 4).
# (depth, top-k, nodes). A verification pays by its weight products, which the model's layout runs padded to 4 or 8
# rows where that measured faster (engine/model/layout.py): 3 nodes verify in the 4 rows of a γ = 3 chain, 7 nodes
# in 8 rows, while 8 nodes need one more product for their ninth row
TREE_SHAPES = {"eagle": [(5, 4, 8), (4, 2, 8), (6, 4, 16), (5, 3, 16), (4, 2, 7), (2, 2, 3)],
               "medusa": [(3, 2, 8), (4, 3, 16)]}
QUICK_TREE_SHAPES = {"eagle": [(5, 4, 8)], "medusa": [(3, 2, 8)]}
DEMO_FILE = "demo.json"
TIE = 0.01          # speed-ups this close are one run's noise apart
ACCEPTANCE_GOAL = 1.2       # the best EAGLE tree of at most 8 nodes against the best chain: mean acceptance length
SMALL_BUDGET = 8


def tree_config(method: str, depth: int, topk: int, budget: int) -> tuple[str, dict]:
    """(label, settings) of a token tree, as cli/bench/smollm2.py's `config` gives a chain's."""
    return (f"{method} tree γ={depth}, top-{topk}, {budget} nodes",
            {"method": method, "num_speculative_tokens": depth, "speculative_eagle_topk": topk,
             "speculative_num_draft_tokens": budget})


def tree_configs(methods, quick: bool = False) -> list[tuple[str, dict]]:
    """The trees `bench heads` measures for these methods (the heads a target has)."""
    shapes = QUICK_TREE_SHAPES if quick else TREE_SHAPES
    return [tree_config(m, *shape) for m in methods for shape in shapes.get(m, [])]


def verified_nodes(settings: dict) -> int:
    """The nodes one verification forward scores at most, besides the root: the budget, a chain's depth."""
    return settings.get("speculative_num_draft_tokens") or settings["num_speculative_tokens"]


def drafting(settings: dict) -> dict:
    """A row's drafting fields from its settings: gamma (the depth), confidence, topk and budget."""
    return {"gamma": settings["num_speculative_tokens"], "confidence": settings.get("draft_confidence_threshold", 0.0),
            "topk": settings.get("speculative_eagle_topk", 1), "budget": verified_nodes(settings)}


def is_tree(row: dict) -> bool:
    return row.get("topk", 1) > 1


def fastest(rows: list[dict]) -> dict | None:
    """The row of the highest measured speed-up among those that wrote plain decoding's output."""
    return max((x for x in rows if x["identical"]), key=lambda x: x["measured"], default=None)


def best_chain(rows: list[dict], method: str) -> dict | None:
    return fastest([x for x in rows if x["method"] == method and not is_tree(x)])


def tree_rows(rows: list[dict]) -> list[dict]:
    """Each tree among `rows` beside plain decoding and the best chain of its method in the same rows: speed-up
    over each (the chain's is the ratio of the two speed-ups over the same plain runs), mean acceptance length
    and its ratio to the chain's, the rows verified and their cost (a row's `curve_ratio`: t(n)/t(1) from the
    verification curve; the in-run v beside it), and the H100 projections of both."""
    out = []
    for x in (x for x in rows if is_tree(x)):
        chain = best_chain(rows, x["method"])
        n = x["budget"] + 1
        out.append({"config": x["config"], "method": x["method"], "depth": x["gamma"], "topk": x["topk"],
                    "budget": x["budget"], "verify_rows": n, "mean_acceptance_length": x["mean_acceptance_length"],
                    "curve_ratio": x.get("curve_ratio"), "v": x["v"],
                    "vs_plain": x["measured"], "identical": x["identical"], "h100_projected": x.get("h100_projected"),
                    "chain": chain and chain["config"],
                    "acceptance_vs_chain": chain and x["mean_acceptance_length"] / chain["mean_acceptance_length"],
                    "vs_chain": chain and x["measured"] / chain["measured"],
                    "chain_h100_projected": chain and chain.get("h100_projected")})
    return out


def tree_goals(trees: list[dict]) -> list[tuple]:
    """The trees' targets on one set's tree rows (goal rows for cli/bench/lib.py's `goals`): the best EAGLE tree
    of at most 8 nodes accepts 1.2x the best chain's mean length; the fastest EAGLE tree is at least as fast as
    the best chain and as plain decoding."""
    eagle = [t for t in trees if t["method"] == "eagle" and t["identical"] and t["chain"]]
    small = max((t for t in eagle if t["budget"] <= SMALL_BUDGET), key=lambda t: t["acceptance_vs_chain"], default=None)
    best = max(eagle, key=lambda t: t["vs_plain"], default=None)
    out = []
    if small:
        out.append((f"EAGLE tree of <= {SMALL_BUDGET} nodes: mean acceptance length / the best chain's",
                    small["acceptance_vs_chain"], ">=", ACCEPTANCE_GOAL,
                    f"{small['acceptance_vs_chain']:.2f} ({small['config']} against {small['chain']})"))
    if best:
        out += [("EAGLE tree at its fastest shape / the best chain (decode)", best["vs_chain"], ">=", 1.0,
                 f"{best['vs_chain']:.2f}x ({best['config']} against {best['chain']})"),
                ("EAGLE tree at its fastest shape / plain decoding (decode)", best["vs_plain"], ">=", 1.0,
                 f"{best['vs_plain']:.2f}x ({best['config']})")]
    return out


# --- the demo's drafting ---------------------------------------------------------------------------------------------
def setting_key(x: dict) -> tuple:
    """(depth, confidence threshold, topk, budget) of a row or of a demo.json entry."""
    if "gamma" in x:
        return x["gamma"], x.get("confidence", 0.0), x.get("topk", 1), x.get("budget", x["gamma"])
    depth = x["num_speculative_tokens"]
    return (depth, x.get("draft_confidence_threshold", 0.0), x.get("speculative_eagle_topk", 1),
            x.get("speculative_num_draft_tokens") or depth)


def best_row(rows: list[dict], current: dict | None = None) -> dict | None:
    """The fastest EAGLE setting, chain or tree, with identical output; the one in use (a demo.json entry) stays
    unless beaten by more than TIE."""
    eagle = [x for x in rows if x["method"] == "eagle"]
    best = fastest(eagle)
    kept = [x for x in eagle if x["identical"] and current and setting_key(x) == setting_key(current)]
    if best and kept and kept[0]["measured"] * (1 + TIE) >= best["measured"]:
        return kept[0]
    return best


def demo_entry(row: dict, date: str) -> dict:
    """A demo.json entry for a row: its drafting (a tree's top-k and budget too) and what measured it."""
    tree = {"speculative_eagle_topk": row["topk"], "speculative_num_draft_tokens": row["budget"]} if is_tree(row) \
        else {}
    return {"num_speculative_tokens": row["gamma"], "draft_confidence_threshold": row.get("confidence", 0.0), **tree,
            "decode_speedup": round(row["measured"], 3), "measured": f"bench heads, {date}, {row['config']}"}


def current_defaults(folder: Path) -> dict[int, dict]:
    """The demo's settings per thread count as last recorded (`record_defaults`)."""
    f = Path(folder) / DEMO_FILE
    return {int(t): e for t, e in json.loads(f.read_text())["by_threads"].items()} if f.is_file() else {}


def record_defaults(folder: Path, date: str, best_by_threads: dict[int, dict | None]) -> dict:
    """Store the best EAGLE setting per thread count in `folder`/demo.json (what the page's demo opens with)."""
    f = Path(folder) / DEMO_FILE
    data = json.loads(f.read_text()) if f.is_file() else {"by_threads": {}}
    for t, row in best_by_threads.items():
        if row is not None:
            data["by_threads"][str(t)] = demo_entry(row, date)
    f.write_text(json.dumps(data, indent=1) + "\n")
    return data
