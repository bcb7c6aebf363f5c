"""vLLM's speculative rounds as its stream shows them, checked against its own per-step figures.

With `"return_token_ids": true`, each streamed chunk of vLLM's chat completions carries the token ids one
engine step produced: the drafts it accepted, then the target's own token (resampled where a draft was
rejected, a bonus where all were accepted). vLLM sends neither the rejected drafts nor how many it drafted;
`--per-request-spec-decode-metrics detailed` puts, in the final usage chunk, `per_step_drafted` and
`per_step_accepted` for the steps that had a draft.

    steps = VllmSteps("ngram", gamma=4, rule=rule)   # rule(ids): how many drafts vLLM's n-gram makes
    steps.prompt(prompt_ids)                    # from the first chunk's prompt_token_ids
    step = steps.take(chunk_token_ids)          # drafted, accepted, each token's status
    report = reconcile(steps.steps, metrics)    # the stream's lists against vLLM's, and where they differ

How many it drafted: n-gram drafts are a function of the tokens so far, so the same rule (vLLM's: the
longest suffix n-gram, its earliest earlier occurrence; our engine's `ngram_propose` in engine/spec_decode/ngram.py,
handed in by whoever configures the server, as this room does not reach our engine) gives the count at each
step, 0 where nothing matched (such steps stream one token and are absent from vLLM's lists). EAGLE and a draft
model draft γ at every step; without a rule, γ is assumed. A chunk with more tokens than a step can emit merges steps (vLLM's output
collector does that when the client reads slower than it decodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..serving.events import TokenResult


@dataclass
class VllmStep:
    drafted: int                 # drafts this step verified (0: no draft, one token from the target)
    accepted: int
    ids: list[int]
    merged: bool = False         # more tokens than one step emits: steps merged into one chunk

    @property
    def statuses(self) -> list[str]:
        if self.drafted == 0 or self.merged:
            return ["target"] * len(self.ids)
        last = "bonus" if self.accepted == self.drafted else "resampled"
        return ["accepted"] * self.accepted + [last] * (len(self.ids) - self.accepted)


@dataclass
class VllmSteps:
    method: str | None                       # None (plain), "ngram", "eagle" or "draft_model"
    gamma: int = 0
    rule: Callable[[list[int]], int] | None = None     # the n-gram rule: drafts made after these ids
    context: list[int] = field(default_factory=list)
    steps: list[VllmStep] = field(default_factory=list)
    # the steps with a draft so far (kept as they come: the gauges read them at every chunk):
    totals: list[int] = field(default_factory=lambda: [0, 0, 0])      # steps, drafted, accepted
    per_position: list[int] = field(default_factory=list)             # steps that accepted position j

    def prompt(self, ids: list[int]) -> None:
        self.context = list(ids)

    def drafts_due(self) -> int:
        """How many drafts vLLM verifies in the next step."""
        if self.method is None or not self.steps:           # the first step is the prefill: nothing to verify
            return 0
        return self.rule(self.context) if self.rule and self.context else self.gamma

    def take(self, ids: list[int]) -> VllmStep:
        drafted = self.drafts_due()
        merged = len(ids) > drafted + 1
        step = VllmStep(drafted, 0 if merged else len(ids) - 1, list(ids), merged)
        self.context += ids
        self.steps.append(step)
        if drafted and not merged:
            self.totals = [self.totals[0] + 1, self.totals[1] + drafted, self.totals[2] + step.accepted]
            self.per_position = (self.per_position or [0] * self.gamma)
            for j in range(min(step.accepted, self.gamma)):
                self.per_position[j] += 1
        return step


def accepted_per_position(per_step_accepted, gamma: int) -> list[int]:
    """Steps whose draft at position j (0-based) was accepted: a step that accepted a drafts counts at 0..a-1."""
    return [sum(1 for a in per_step_accepted if a > j) for j in range(gamma)]


def figures(drafted: list[int], accepted: list[int]) -> dict:
    """Acceptance rate (accepted drafts / drafts) and mean acceptance length (tokens per step with a draft)."""
    return totals_figures(len(drafted), sum(drafted), sum(accepted))


def totals_figures(steps: int, num_drafted: int, num_accepted: int) -> dict:
    return {"num_drafts": steps, "num_draft_tokens": num_drafted, "num_accepted_tokens": num_accepted,
            "acceptance_rate": num_accepted / num_drafted if num_drafted else None,
            "mean_acceptance_length": 1 + num_accepted / steps if steps else None}


def acceptance_figures(steps: int, accepted_by_position: list[int]) -> dict:
    """Mean acceptance length (tokens per step with a draft) and acceptance per draft position, of `steps` steps
    with a draft and how many of them accepted the draft at each position (summed over runs to pool them)."""
    return {"steps": steps, "mean_acceptance_length": 1 + sum(accepted_by_position) / steps if steps else None,
            "acceptance_per_position": [a / steps if steps else 0.0 for a in accepted_by_position]}


def own_counts(metrics: dict | None, gamma: int) -> tuple[int, list[int]] | None:
    """vLLM's own per-request counts (`metrics.speculative_decoding`, --per-request-spec-decode-metrics
    detailed): its steps with a draft, and how many accepted the draft at each position (None: not sent)."""
    spec = (metrics or {}).get("speculative_decoding") or {}
    steps, accepted = spec.get("num_spec_steps"), spec.get("per_step_accepted")
    if not isinstance(steps, int) or not isinstance(accepted, list):
        return None
    return steps, accepted_per_position(accepted, gamma)


def stream_figures(steps: VllmSteps) -> dict:
    """What the stream says so far (the page's gauges while vLLM runs): its steps with a draft."""
    return {**totals_figures(*steps.totals), "num_speculative_tokens": steps.gamma or None,
            "accepted_per_position": list(steps.per_position or [0] * steps.gamma)}


def reconcile(steps: list[VllmStep], metrics: dict | None, gamma: int) -> dict:
    """The stream's per-step lists (steps with a draft) against vLLM's `per_step_*`, with what differs.

    The last step may be cut: vLLM counts the drafts it accepted, but streams only the tokens before the stop
    (end of sequence, max_tokens). Where only that differs, the last step takes vLLM's count, and a note says so;
    `reconciled` holds the lists and figures the page reports at the end."""
    spec = (metrics or {}).get("speculative_decoding") or {}
    theirs_d, theirs_a = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    drafting = [s for s in steps if s.drafted and not s.merged]
    ours_d, ours_a = [s.drafted for s in drafting], [s.accepted for s in drafting]
    merged = sum(s.merged for s in steps)
    out = {"stream": {"per_step_drafted": ours_d, "per_step_accepted": ours_a, **figures(ours_d, ours_a),
                      "accepted_per_position": accepted_per_position(ours_a, gamma)},
           "chunks": len(steps), "steps_without_draft": sum(1 for s in steps if not s.drafted and not s.merged),
           "merged_chunks": merged, "notes": []}
    if not isinstance(theirs_d, list) or not isinstance(theirs_a, list):
        out.update(agree=None, vllm=None, reconciled=out["stream"])
        out["notes"].append("vLLM sent no per-step lists (--per-request-spec-decode-metrics detailed)")
        return out
    out["vllm"] = {"per_step_drafted": theirs_d, "per_step_accepted": theirs_a, **figures(theirs_d, theirs_a),
                   "accepted_per_position": accepted_per_position(theirs_a, gamma)}
    cut = (bool(drafting) and steps[-1] is drafting[-1] and ours_d == theirs_d and ours_a[:-1] == theirs_a[:-1]
           and ours_a[-1] < theirs_a[-1])
    lists_a = ours_a[:-1] + [theirs_a[-1]] if cut else ours_a
    out["reconciled"] = {"per_step_drafted": ours_d, "per_step_accepted": lists_a, **figures(ours_d, lists_a),
                         "accepted_per_position": accepted_per_position(lists_a, gamma)}
    out["agree"] = ours_d == theirs_d and lists_a == theirs_a
    if cut:
        out["notes"].append(f"the last step was cut by the stop: vLLM accepted {theirs_a[-1]} of its drafts, the "
                            f"stream shows {ours_a[-1]} before the stop; vLLM's count is taken")
    if merged:
        out["notes"].append(f"{merged} chunk(s) merged several steps (the stream was read slower than vLLM "
                            "decoded): their steps are vLLM's lists' only")
    if out["steps_without_draft"]:
        out["notes"].append(f"{out['steps_without_draft']} step(s) had no draft (nothing to look up): one token "
                            "each, not in vLLM's lists")
    if not out["agree"]:
        first = next((i for i, pair in enumerate(zip(zip(ours_d, lists_a), zip(theirs_d, theirs_a)))
                      if pair[0] != pair[1]), min(len(ours_d), len(theirs_d)))
        out["notes"].append(f"the stream's steps differ from vLLM's from step {first + 1} with a draft on: "
                            f"{len(ours_d)} steps against {len(theirs_d)}, {sum(lists_a)} accepted against "
                            f"{sum(theirs_a)}")
    return out


def per_position_moved(moved_by_position: dict[str, float], gamma: int) -> list[int]:
    """vLLM's /metrics `spec_decode_num_accepted_tokens_per_pos_total` deltas as a list by position."""
    return [int(moved_by_position.get(str(j), 0)) for j in range(gamma)]


@dataclass(frozen=True)
class StepRules:
    """What a client needs to read one vLLM server's steps: its method and γ, and from our side (handed in)
    the n-gram rule, the token texts (display only: the text of a run is vLLM's own detokenized deltas) and
    the prompt's tokens as its chat template makes them (`started` shows them before vLLM's first chunk,
    which has its own ids: `num_prompt_tokens` of the summary)."""
    method: str | None
    gamma: int = 0
    drafts_due: Callable[[list[int]], int] | None = None
    token_texts: Callable[[list[int]], list[str]] | None = None
    prompt_tokens: Callable[[str], list[dict]] | None = None

    def new(self) -> VllmSteps:
        return VllmSteps(self.method, self.gamma, self.drafts_due)


def step_tokens(rules: StepRules, steps: VllmSteps, round_: int, ids: list[int], text: str) -> tuple[list, VllmStep]:
    """One chunk's tokens as our TokenResults (ids, statuses; texts from `token_texts`, else the chunk's text
    on its last token) and the step it was."""
    step = steps.take(ids)
    texts = rules.token_texts(ids) if rules.token_texts else [""] * (len(ids) - 1) + [text]
    if len(texts) != len(ids) or "".join(texts) != text:      # ours detokenize otherwise: vLLM's text stands
        texts = [""] * (len(ids) - 1) + [text]
    events = [TokenResult(round_, i, tid, t, status, None, None, None, None)
              for i, (tid, t, status) in enumerate(zip(ids, texts, step.statuses), 1)]
    return events, step
