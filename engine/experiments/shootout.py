"""The shoot-out: one prompt, every method a target supports, timed by the one comparison method
(engine/experiments/compare.py: plain decoding and every method interleaved, repeated, on the runs' engine
clocks; plain decoding is the reference). t(1) is the median one-token forward of the plain runs, which every
method's c and verify cost divide by. Per method:
- mean acceptance length L (tokens per target call) and acceptance per draft position;
- c: drafting time per draft token / t(1); v: the method's mean verification forward / t(1), over k + 1 rows with
  k its drafted tokens per round (γ, fewer where a confidence threshold stopped the drafter, or near the end);
- predicted speed-up L / (k c + v), from these inputs of its own runs, and the measured one: the comparison's
  median of plain engine time per token / the method's, its spread and its verdict;
- whether it wrote exactly the plain text; Spec-Bench's published figure beside it; for draft heads, the
  same acceptance projected on an H100 with the Cost model's roofline (engine/experiments/theory.py).

Beside the chains, one token tree of the target's best tree drafter (race.py's `tree_method`: its EAGLE head, else
its Medusa heads, else n-gram lookup) at the page's depth γ: the page's top-k and budget where it sets a tree, else
top-TREE_TOPK and `tree_budget`'s nodes. Its k is the tree's nodes per round (the rows it verifies, less one), its
L the tokens each verification forward gave, and its draft forwards per round the depths it expanded.

For the model vLLM serves (`serve --vllm`), one more row after the comparison: our EAGLE head in vLLM (its
eagle server, engine/external/vllm_server.py), the same prompt through its chat endpoint, greedy, the same
max_tokens, with vLLM's own per-request acceptance figures, and whether it wrote our plain text. Its time is
not comparable (another process, on another clock) and is not measured; where vLLM cannot answer, the row says
why, and the rest of the table stands.
"""
from __future__ import annotations

import math
import statistics
import time

from ..external.engine_race import external_trace
from ..external.vllm_rounds import acceptance_figures, own_counts
from ..external.vllm_server import SERVED_NAME, VllmServer
from ..serving.jobs import Job, run_to_end
from ..serving.registry import InferenceEngine
from ..serving.settings import GenerationSettings, SettingsError
from .compare import comparison_steps
from .race import TREE_TOPK, tree_budget, tree_method
from .theory import ACCELERATORS, projected_costs

# Spec-Bench (Xia et al. 2024), Vicuna-7B, greedy, A100: mean accepted tokens per round (prompt lookup = ngram)
SPEC_BENCH = {"eagle": 3.57, "medusa": 2.32, "draft_model": 2.29, "ngram": 1.74}
LABELS = {"none": "plain decoding", "ngram": "n-gram lookup", "draft_model": "draft model", "medusa": "Medusa",
          "eagle": "EAGLE"}


def methods_for(engine: InferenceEngine, target) -> list[str]:
    heads = engine.registry.heads_for(target)
    return (["ngram"] + (["draft_model"] if engine.registry.draft_for(target) is not None else [])
            + [m for m in ("medusa", "eagle") if m in heads])


def h100_speedup(engine: InferenceEngine, target, method: str, acceptance_length: float, drafts_per_round: float,
                 context: int, nodes_per_round: float | None = None) -> float | None:
    """A draft head's measured acceptance length L and draft forwards per round k on an H100's roofline
    (parameters in bf16, KV of one layer for EAGLE): L / (k c + t(rows)/t(1)), rows = the nodes verified + 1
    rounded up (a chain's nodes: k; a tree's: its budget, drafted in k forwards over its frontiers, each costing
    a one-row pass on a roofline that reads the weights once). Medusa's heads draft in one pass (k = 1 for its
    c): its c is every head's bytes, read once."""
    head = engine.registry.heads_for(target).get(method)
    if head is None:
        return None
    cfg = target.cfg
    kv_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    p = projected_costs(ACCELERATORS["H100-SXM"], math.ceil(nodes_per_round or drafts_per_round),
                        target.model.num_parameters, head.num_parameters + len(head.subset) * cfg.hidden_size,
                        kv_layer * cfg.num_hidden_layers, kv_layer if method == "eagle" else 0, context)
    passes = 1 if method == "medusa" else drafts_per_round
    return acceptance_length / (passes * p["c"] + p["verify_ratio"])


def shootout(engine: InferenceEngine, prompt: str, settings: dict, repeats: int | None = None) -> dict:
    return run_to_end(shootout_steps(engine, prompt, settings, repeats))


def shootout_steps(engine: InferenceEngine, prompt: str, settings: dict, repeats: int | None = None) -> Job[dict]:
    s = GenerationSettings.parse({k: v for k, v in settings.items() if k != "fault"}).model_dump()
    target = engine.registry.get(s["model"])
    chain = {**s, "speculative_eagle_topk": 1}           # the chains stay chains where the page sets a tree
    sides = {"none": {**chain, "method": "none"}, **{m: {**chain, "method": m} for m in methods_for(engine, target)}}
    m = tree_method(engine.registry, target)
    sides[f"{m}_tree"] = {**s, "method": m, "speculative_eagle_topk": s["speculative_eagle_topk"] if s[
        "speculative_eagle_topk"] > 1 else TREE_TOPK, "speculative_num_draft_tokens": tree_budget(s)}
    return _shootout(engine, target, s, comparison_steps(engine, prompt, sides, repeats, with_times=True))


def pooled_ms(runs: list, n: int, upto: int | None = None) -> list[float]:
    """Every forward over n rows (n to `upto` rows) of these runs, in ms."""
    return [ms for r in runs for rows in range(n, (upto or n) + 1) for ms in (r.get("forward_ms") or {}).get(rows) or []]


def _shootout(engine: InferenceEngine, target, s: dict, comparison: Job[dict]) -> Job[dict]:
    c = yield from comparison
    gamma = s["num_speculative_tokens"]
    plain = c["sides"]["none"]
    ones = pooled_ms(plain["runs"], 1)
    t1 = statistics.median(ones) if ones else None
    rows = []
    for name, side in c["sides"].items():
        r = side["run"]
        sm = r["summary"] or {}
        m, rs = r["settings"]["method"], r["settings"]
        tree = {"topk": rs["speculative_eagle_topk"], "num_draft_tokens": rs["speculative_num_draft_tokens"],
                "depth": gamma} if rs["speculative_eagle_topk"] > 1 else None
        label = f"{LABELS[m]} tree (top-{tree['topk']}, {tree['num_draft_tokens']} nodes)" if tree else LABELS[m]
        row = {"method": name, "label": label, "tree": tree, "error": side["error"],
               "spec_bench": None if tree else SPEC_BENCH.get(m),
               "identical": r["emitted_ids"] == plain["run"]["emitted_ids"], "ms_per_token": side["median_ms_per_token"],
               "measured": side.get("speedup")}
        drafts = sm.get("num_drafts") or 0
        if m != "none" and drafts and t1:
            nodes = sm["num_draft_tokens"] / drafts             # below γ where a confidence threshold stopped it
            passes = "draft_forward_calls" if tree else "num_draft_tokens"      # a tree's: one per depth
            k = sm[passes] / drafts
            L = sm["mean_acceptance_length"]
            c_each = [x["summary"]["draft_time_s"] * 1e3 / x["summary"][passes] / t1
                      for x in side["runs"] if x["summary"] and x["summary"][passes]]
            verify = pooled_ms(side["runs"], 2, math.ceil(nodes) + 1)
            v = statistics.mean(verify) / t1 if verify else None
            cost = statistics.median(c_each) if c_each else 0.0       # (an n-gram tree: no draft forward)
            rejected = drafts - sum(1 for t in sm["tokens"] if t["status"] == "bonus")
            acc = sm["num_accepted_tokens"]
            alpha = acc / (acc + rejected) if acc + rejected else 0.0
            row.update(mean_acceptance_length=L,
                       per_position=[a / drafts for a in sm["accepted_per_position"][:gamma]],
                       c=cost, verify_ratio=v, drafts_per_round=k, verify_rows=nodes + 1, alpha=alpha,
                       predicted=L / (k * cost + v) if v else None,
                       h100=h100_speedup(engine, target, m, L, k, len(r["emitted_ids"]) + 64, nodes))
        rows.append(row)
    return {"settings": s, "model": target.name, "gamma": gamma, "t1_ms": t1, "rows": rows, "repeats": c["repeats"],
            "load_average": c["load_average"], "cores": c["cores"],
            "text": plain["run"]["summary"]["text"] if plain["run"]["summary"] else "",
            "plain_ids": plain["run"]["emitted_ids"], "eos_token_id": target.tokenizer.eos_token_id}


VLLM_LABEL = "EAGLE (our head) in vLLM"
VLLM_TIME = "not measured: another process, on another clock"


def vllm_unavailable(started: bool, reason: str | None, server: VllmServer | None) -> str | None:
    """Why vLLM with our head cannot answer now, in one line (None: its server is ready). `started`: the app
    runs vLLM (serve --vllm); `reason`: why vLLM is not offered at all; `server`: its eagle server, if any."""
    if not started:
        return "vLLM not started: serve --vllm"
    if reason:
        return f"vLLM not offered: {reason}"
    if server is None:
        return "vLLM's EAGLE server not offered (--vllm-variants leaves it out, or our head could not be exported)"
    if server.state == "starting":
        return (f"starting ({time.monotonic() - server.started_at:.0f} s so far): run the shoot-out again once "
                "it is ready")
    if server.state == "failed":
        return f"failed: {server.error}"
    return None if server.state == "ready" else server.state


async def vllm_row(r: dict, prompt: str, started: bool, reason: str | None, server: VllmServer | None) -> dict | None:
    """The row of our EAGLE head in vLLM for a shoot-out `r` on `prompt` (None: r's model is not the one vLLM
    serves). Its figures are vLLM's own per-request ones; `identical`: its output ids equal our plain decoding's
    (the end-of-sequence token aside), where both are greedy and chat (None otherwise, with a note)."""
    if r["model"] != SERVED_NAME:
        return None
    gamma = (server.variant.speculative or {}).get("num_speculative_tokens") if server else None
    row = {"method": "vllm_eagle", "label": VLLM_LABEL, "gamma": gamma, "time": VLLM_TIME, "notes": [],
           "unavailable": vllm_unavailable(started, reason, server), "error": None}
    if row["unavailable"]:
        return row
    if gamma != r["gamma"]:
        row["notes"].append(f"vLLM's server is fixed at γ = {gamma}, this shoot-out ran γ = {r['gamma']}")
    s = r["settings"]
    try:
        run = await external_trace(server.engine, prompt, {"max_tokens": s["max_tokens"], "temperature": 0})
    except SettingsError as e:
        row["error"] = str(e)
        return row
    summary = run["summary"]
    counts = own_counts(summary["engine_metrics"], gamma) if summary else None
    if run["error"] or counts is None:
        row["error"] = run["error"] or "vLLM sent no per-request figures (--per-request-spec-decode-metrics detailed)"
        return row
    fig = acceptance_figures(*counts)
    row.update(mean_acceptance_length=fig["mean_acceptance_length"], per_position=fig["acceptance_per_position"],
               steps=fig["steps"])
    eos = r["eos_token_id"]
    if s["temperature"] > 0 or not s["chat"]:
        row["identical"] = None
        row["notes"].append("output not compared: vLLM's row is greedy with the chat template, this shoot-out "
                            + ("sampled" if s["temperature"] > 0 else "ran without the chat template"))
    else:
        row["identical"] = ([t["id"] for t in summary["tokens"] if t["id"] != eos]
                            == [i for i in r["plain_ids"] if i != eos])
    return row
