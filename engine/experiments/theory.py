"""The formulas the seed articles use, as small functions, and the projections built on them.

Notation of Leviathan et al. (2023): alpha is the acceptance rate of one draft token, gamma the number
of draft tokens per round (vLLM's num_speculative_tokens), c the cost of one draft step in target steps.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per target call (Leviathan et al., eq. 1)."""
    if alpha >= 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speedup_flat_verify(alpha: float, gamma: int, c: float) -> float:
    """(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)): Theorem 3.8, verifying gamma+1 tokens costs one step."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1)


def speedup_from_curve(alpha: float, gamma: int, c: float, verify_ratio: float) -> float:
    """The same with a measured verify cost: verify_ratio = t(gamma+1) / t(1) of one target forward."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + verify_ratio)


# The second seed article's worked table: (alpha, c, gamma) -> E and the speed-up, incl. the 0.88x slowdown.
WORKED_TABLE = [(0.8, 0.1, 4), (0.8, 0.1, 8), (0.5, 0.1, 4), (0.5, 0.3, 4)]


def worked_table() -> list[dict]:
    return [{"alpha": a, "c": c, "gamma": g, "expected_tokens": expected_tokens_per_round(a, g),
             "speedup": speedup_flat_verify(a, g, c)} for a, c, g in WORKED_TABLE]


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bandwidth: float     # bytes / s
    peak_flops: float           # dense bf16 FLOP / s
    memory_bytes: float


# Bandwidths as the second seed article lists them; dense bf16 peaks from the vendor's data sheets.
ACCELERATORS = {
    "H100-SXM": Accelerator("NVIDIA H100 (SXM)", 3.35e12, 989e12, 80e9),
    "H200-SXM": Accelerator("NVIDIA H200 (SXM)", 4.8e12, 989e12, 141e9),
}


def roofline_step_seconds(acc: Accelerator, weight_bytes: float, kv_bytes_read: float, flops_per_token: float,
                          tokens: int, batch: int = 1) -> float:
    """One forward of `tokens` new tokens for each of `batch` sequences, as the slower of moving the bytes
    (weights once, every sequence's KV) and doing the FLOPs. A projection, not a measurement."""
    moved = weight_bytes + batch * kv_bytes_read
    return max(moved / acc.memory_bandwidth, batch * tokens * flops_per_token / acc.peak_flops)


def projected_costs(acc: Accelerator, gamma: int, target_params: float, draft_params: float,
                    kv_bytes_per_token: float, draft_kv_bytes_per_token: float, context: int,
                    bytes_per_param: float = 2.0, batch: int = 1) -> dict:
    """One target step, c and t(gamma+1)/t(1) on a roofline model of `acc` (2 FLOPs per parameter per token)."""
    t1 = roofline_step_seconds(acc, target_params * bytes_per_param, kv_bytes_per_token * context,
                               2 * target_params, 1, batch)
    tv = roofline_step_seconds(acc, target_params * bytes_per_param, kv_bytes_per_token * context,
                               2 * target_params, gamma + 1, batch)
    td = roofline_step_seconds(acc, draft_params * bytes_per_param, draft_kv_bytes_per_token * context,
                               2 * draft_params, 1, batch)
    return {"accelerator": acc.name, "batch": batch, "target_step_ms": t1 * 1e3, "verify_ratio": tv / t1, "c": td / t1}


def projected_speedup(acc: Accelerator, alpha: float, gamma: int, target_params: float, draft_params: float,
                      kv_bytes_per_token: float, draft_kv_bytes_per_token: float, context: int,
                      bytes_per_param: float = 2.0, batch: int = 1) -> dict:
    """Speculative speed-up on a roofline model of `acc` at acceptance rate alpha."""
    p = projected_costs(acc, gamma, target_params, draft_params, kv_bytes_per_token, draft_kv_bytes_per_token,
                        context, bytes_per_param, batch)
    return {**p, "speedup": speedup_from_curve(alpha, gamma, p["c"], p["verify_ratio"])}


def projected_verify_curve(acc: Accelerator, params: float, kv_bytes_per_token: float, context: int, ns,
                           batch: int = 1, bytes_per_param: float = 2.0) -> dict[int, float]:
    """t(n) / t(1) on the roofline model: the projected cost of verifying n tokens in one forward, in plain
    steps (flat at 1 while moving the bytes dominates, rising once the FLOPs do). A projection."""
    def step(n):
        return roofline_step_seconds(acc, params * bytes_per_param, kv_bytes_per_token * context, 2 * params, n, batch)
    t1 = step(1)
    return {n: step(n) / t1 for n in ns}


def accelerator_projections(alpha: float, gamma: int, target_params: float, target_kv_bytes_per_token: float,
                            draft_params: float, draft_kv_bytes_per_token: float, context: int, ns, batch: int = 1,
                            batches=()) -> list[dict]:
    """For every accelerator: its projected verify curve t(n)/t(1) at `batch`, the speculative speed-up at
    `batch` (`p`), and the speed-up at each of `batches` (`by_batch`). Projections, not measurements."""
    def project(acc, b):
        return projected_speedup(acc, alpha, gamma, target_params, draft_params, target_kv_bytes_per_token,
                                 draft_kv_bytes_per_token, context, batch=b)

    return [{"key": key, "acc": acc, "p": project(acc, batch), "by_batch": [project(acc, b) for b in batches],
             "curve": projected_verify_curve(acc, target_params, target_kv_bytes_per_token, context, ns, batch)}
            for key, acc in ACCELERATORS.items()]


@dataclass(frozen=True)
class RoundPoint:
    """One round of a run as the Theory view counts it (a `round` event's figures)."""
    target_ms: float
    draft_ms: float
    emitted: int
    drafted: int
    accepted: int
    depth: int = 0                        # a token tree's round: the depth its tree reached (0: a chain's round)
    first_tries: tuple[bool, ...] = ()    # and per position whose parent had children tried, whether the first
    #                                       child tried (the drafter's first choice) was accepted


def run_alpha(points) -> float | None:
    """α of a run: accepted draft tokens / draft tokens judged (a rejection ends its round, so the tokens
    after it were never judged). None if nothing was proposed."""
    proposing = [p for p in points if p.drafted]
    tested = sum(judged(p) for p in proposing)
    return sum(p.accepted for p in proposing) / tested if tested else None


def longest_path(p: RoundPoint) -> int:
    """The most drafts a round could accept: a chain's length, a token tree's depth (its other nodes are
    siblings, tried in place of one another)."""
    return p.depth or p.drafted


def judged(p: RoundPoint) -> int:
    """The drafts a round's verification judged: the accepted ones, and the first rejected one if any."""
    return p.accepted + (p.accepted < longest_path(p))


def curve_ratios(curve: dict | None) -> tuple[float | None, dict | None]:
    """t(1) and t(n)/t(1) of a measured verify-cost curve (engine/experiments/measure.py); (None, None) without one."""
    if curve is None:
        return None, None
    t1 = curve["target_ms"][1]
    return t1, {n: ms / t1 for n, ms in curve["target_ms"].items()}


def run_series(points, t1_ms: float | None, verify_ratio: dict | None, method: str) -> dict:
    """The Theory view's figures after each round of a run, measured beside predicted: tokens per target call
    (measured) and E with the α so far (predicted); the speed-up predicted as E / (kc + 1) (flat verify) and
    E / (kc + t(k+1)/t(1)) (the measured curve), with k the tokens drafted in each round (not γ: a confidence
    threshold drafts fewer), and estimated as tokens per call × t(1) ÷ the median round's forward time (a round
    now and then is slowed by the machine); acceptance per draft position beside α^i; the summary of the run.

    Rounds with different k are weighted by how many there were. c is measured inside the run: its proposal
    time per draft token / t(1), whatever the method (`method` names the run's drafter). A token tree's round
    counts as a chain as long as its depth in E, α and the positions (the accepted path is one node per depth),
    and its k nodes in the cost (kc, t(k+1)/t(1)): a tree of 8 nodes is no chain of 8."""
    counts: dict[tuple[int, int], int] = {}     # (longest path, nodes) -> rounds: E takes the path, the cost the nodes
    n = emitted = accepted = tested = drafted = 0
    draft_ms, round_ms = 0.0, []
    out = {"tokens": [], "e": [], "flat": [], "curve": [], "estimated": []}
    c = 0.0
    for p in points:
        n += 1
        emitted += p.emitted
        bisect.insort(round_ms, p.target_ms + p.draft_ms)
        key = (longest_path(p), p.drafted)
        counts[key] = counts.get(key, 0) + 1
        if p.drafted:
            accepted += p.accepted
            drafted += p.drafted
            tested += judged(p)
            draft_ms += p.draft_ms
        out["tokens"].append(emitted / n)
        if not tested:
            for key in ("e", "flat", "curve", "estimated"):
                out[key].append(None)
            continue
        alpha = accepted / tested
        c = draft_ms / drafted / t1_ms if t1_ms and drafted else 0.0
        sum_e = sum(m * expected_tokens_per_round(alpha, path) for (path, _), m in counts.items())
        flat = sum(m * (k * c + 1) for (_, k), m in counts.items())
        ratios = [(verify_ratio or {}).get(k + 1) for _, k in counts]
        curve = (sum(m * (k * c + r) for ((_, k), m), r in zip(counts.items(), ratios))
                 if t1_ms and None not in ratios else None)
        median = statistics.median(round_ms)
        out["e"].append(sum_e / n)
        out["flat"].append(sum_e / flat if t1_ms else None)
        out["curve"].append(sum_e / curve if curve else None)
        out["estimated"].append(t1_ms * (emitted / n) / median if t1_ms and median else None)
    alpha = accepted / tested if tested else None
    proposing = sum(m for (_, k), m in counts.items() if k)
    gamma = drafted / proposing if proposing else None
    positions = []
    for j in range(1, max((path for path, _ in counts), default=0) + 1):
        tried = sum(1 for p in points if longest_path(p) >= j)
        ok = sum(1 for p in points if longest_path(p) >= j and p.accepted >= j)
        positions.append({"position": j, "rate": ok / tried if tried else None,
                          "formula": alpha ** j if alpha is not None else None})
    last = {key: values[-1] if values else None for key, values in out.items()}
    summary = {"rounds": n, "alpha": alpha, "acceptance_rate": accepted / drafted if drafted else None,
               "gamma": gamma, "c": c if t1_ms and drafted else None, "t1_ms": t1_ms, "method": method,
               "verify_ratio": (verify_ratio or {}).get(round(gamma) + 1) if gamma is not None else None,
               **{key: last[key] for key in ("tokens", "e", "flat", "curve", "estimated")}}
    return {**out, "positions": positions, "summary": summary}


def tree_against_chain(points) -> dict | None:
    """A token tree's measured tokens per target forward beside Leviathan's E for a chain (None: no tree round).

    L = 1 + accepted / tree rounds (the mean acceptance length, the bonus or resampled token included). The chain
    is the one the same drafter draws at the same depth: its token at each depth is a node's first child (the
    drafter's first choice: EAGLE's and Medusa's most likely token, n-gram lookup's most frequent continuation),
    so its α is measured inside the tree's rounds as how often the first child tried was accepted, and its E is
    (1 - α^(γ+1)) / (1 - α) at each round's depth γ, averaged over the rounds. L / E is what the tree's other
    branches added."""
    rounds = [p for p in points if p.depth]
    if not rounds:
        return None
    tries = [hit for p in rounds for hit in p.first_tries]
    alpha = sum(tries) / len(tries) if tries else None
    L = 1 + sum(p.accepted for p in rounds) / len(rounds)
    chain_e = (statistics.fmean(expected_tokens_per_round(alpha, p.depth) for p in rounds)
               if alpha is not None else None)
    return {"rounds": len(rounds), "mean_acceptance_length": L, "alpha": alpha,
            "depth": statistics.fmean(p.depth for p in rounds), "chain_e": chain_e,
            "gain": L / chain_e if chain_e else None}


def cost_card_here(run: dict | None, curve: dict, method: str | None, alpha: float, gamma: int) -> dict:
    """The Cost card's "here" inputs: c measured inside the page's run (its proposals' time per draft token, `run`:
    `run_series`' summary), else the draft model's step measured with the `curve`; what that c is; and the
    speed-up the measured curve gives for the form's α and γ with it (None without a c or a physical curve)."""
    if run is not None and run["gamma"] is not None and run["c"] is not None:
        c, of = run["c"], f"{method}, measured in the page's run"
    else:
        c, of = curve["c"], (f"draft model {curve['draft']}'s step, measured with the curve" if curve["draft"] else None)
    _, ratios = curve_ratios(curve)
    what_if = speedup_from_curve(alpha, gamma, c, ratios[gamma + 1]) if c is not None and curve["physical"] else None
    return {"c": c, "of": of, "what_if": what_if}


@dataclass(frozen=True)
class SuffixRound:
    """One round of suffix decoding as the Theory view counts it: its match and what came of it."""
    match_len: int              # tokens of the context's end matched in a suffix tree (the draft event's origin)
    drafted: int
    accepted: int


def suffix_draft_bound(match_len: int, gamma: int, max_spec_factor: float, max_tree_depth: int) -> int:
    """The longest draft a match of `match_len` tokens allows (engine/spec_decode/suffix.py's rule, vLLM's):
    at most γ, at most max_spec_factor × the match (the float32 rounding of ArcticInference aside), and no deeper
    than the trees, which hold match and continuation together in max_tree_depth tokens."""
    return max(0, min(gamma, int(match_len * max_spec_factor + 1e-6), max_tree_depth - match_len))


def suffix_series(rounds, gamma: int, max_spec_factor: float, max_tree_depth: int) -> dict | None:
    """Suffix decoding's draft length following its match length, round by round (`rounds`: SuffixRound) with the
    bound the rule sets at each match length, and per match length the rounds' mean draft and accepted lengths.
    None without a suffix round."""
    rounds = list(rounds)
    if not rounds:
        return None
    by: dict[int, list[SuffixRound]] = {}
    for r in rounds:
        by.setdefault(r.match_len, []).append(r)
    return {"match_len": [r.match_len for r in rounds], "drafted": [r.drafted for r in rounds],
            "accepted": [r.accepted for r in rounds],
            "bound": [suffix_draft_bound(r.match_len, gamma, max_spec_factor, max_tree_depth) for r in rounds],
            "by_match": [{"match_len": m, "rounds": len(rs), "drafted": statistics.mean(r.drafted for r in rs),
                          "accepted": statistics.mean(r.accepted for r in rs),
                          "bound": suffix_draft_bound(m, gamma, max_spec_factor, max_tree_depth)}
                         for m, rs in sorted(by.items())],
            "gamma": gamma, "max_spec_factor": max_spec_factor, "max_tree_depth": max_tree_depth}
