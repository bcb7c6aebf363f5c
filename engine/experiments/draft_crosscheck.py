"""Our draft model against vLLM's `draft_model` with the same draft (its export, engine/training/vllm_draft_export.py):
greedy, γ = 4, the step lists of each prompt side by side, and why they part where they do (`bench heads`).

    ours = our_steps(engine, "smollm2-135m", prompt, 96, 4)     # our rounds with a draft: drafted, accepted, drafts
    theirs = vllm_steps(server, prompt, 96)                     # vLLM's per_step_drafted / per_step_accepted
    compare_steps(ours, theirs, outside)                        # equal, or where and why not

What can part them, each named where it happens:
- a context token outside the subset S: our draft can propose it, the export's fixed LM head cannot (its rows
  outside S are zero); the first step that differs holds such a draft of ours;
- the stop: our last round drafts only what max_tokens leaves room for; vLLM drafts γ and counts the drafts it
  accepted past the end (`at_our_stop` reads its lists our way, and both comparisons are reported);
- the target's own greedy choice (a float32 near tie, summed in another order): the two texts part, and the
  steps with them.
Anything else is reported as unexplained.
"""
from __future__ import annotations


import numpy as np

from ..external.openai_stream import run_coroutine, stream_chat
from ..serving.session import GenerationSession


def our_steps(engine, name: str, prompt: str, max_tokens: int, gamma: int) -> dict:
    """Our greedy run with the draft model: emitted ids and, per round with a draft, drafted, accepted, the drafts
    up to the first rejected one."""
    settings = {"model": name, "chat": True, "temperature": 0, "max_tokens": max_tokens, "method": "draft_model",
                "num_speculative_tokens": gamma, "enable_prefix_caching": False}
    events = list(GenerationSession(engine, prompt, settings).events())
    if events[-1].type != "done":
        raise RuntimeError(f"our run failed: {getattr(events[-1], 'message', events[-1])}")
    drafts: dict[int, list[int]] = {}
    for e in events:
        if e.type == "token" and e.status in ("accepted", "rejected"):
            drafts.setdefault(e.round, []).append(e.id)
    rounds = [e for e in events if e.type == "round" and e.num_draft_tokens]
    return {"ids": [e.id for e in events if e.type == "token" and e.status != "rejected"],
            "drafted": [r.num_draft_tokens for r in rounds], "accepted": [r.num_accepted for r in rounds],
            "drafts": [drafts.get(r.round, []) for r in rounds]}


def vllm_steps(server, prompt: str, max_tokens: int) -> dict:
    """vLLM's greedy chat run (our client): emitted ids and its own per-step lists (steps with a draft)."""
    async def run():
        return [e async for e in stream_chat(server.engine, prompt, {"max_tokens": max_tokens, "temperature": 0.0})]
    events = run_coroutine(run())
    if events[-1].type != "done":
        raise RuntimeError(f"vLLM's run failed: {events[-1].message}")
    s = events[-1].summary
    spec = (s.get("engine_metrics") or {}).get("speculative_decoding") or {}
    if not isinstance(spec.get("per_step_accepted"), list):
        raise RuntimeError("vLLM sent no per-step lists (--per-request-spec-decode-metrics detailed)")
    return {"ids": [t["id"] for t in s["tokens"]], "drafted": spec["per_step_drafted"],
            "accepted": spec["per_step_accepted"], "stream_agrees": (s.get("vllm_rounds") or {}).get("agree")}


def at_our_stop(accepted: list[int], max_tokens: int, gamma: int) -> list[int]:
    """vLLM's per-step accepted counts as our rounds would have them at max_tokens: our round drafts
    min(γ, max_tokens - emitted - 1) (its bonus or replacement token takes one place) and none where that is 0
    (a plain step, in neither list); vLLM drafts γ to the end and counts the drafts it accepted past the stop."""
    out, emitted = [], 1                                     # the prefill's token
    for a in accepted:
        k = min(gamma, max_tokens - emitted - 1)
        if k <= 0:
            break
        out.append(min(a, k))
        emitted += out[-1] + 1
    return out


def compare_steps(ours: dict, theirs: dict, outside, max_tokens: int, gamma: int, eos: int | None = None) -> dict:
    """Whether the per-step accepted lists are equal as they are, and with the stop read our way (`at_our_stop`);
    if not, from which step and why (the module docstring's reasons). outside: [V] bool, tokens outside S."""
    a, b = ours["accepted"], at_our_stop(theirs["accepted"], max_tokens, gamma)
    out = {"steps": [len(a), len(theirs["accepted"])], "accepted": [sum(a), sum(theirs["accepted"])],
           "equal": a == theirs["accepted"], "equal_at_stop": a == b, "step": None, "why": None}
    if out["equal"]:
        return out
    if out["equal_at_stop"]:
        last = f"vLLM's last step drafted {theirs['drafted'][-1]} and accepted {theirs['accepted'][-1]}"
        out["why"] = (f"the stop: {last}, where our last step had no room to draft" if len(b) < len(theirs["accepted"])
                      else f"the stop: {last}, ours {ours['drafted'][-1]}, all that max_tokens {max_tokens} left room for")
        return out
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    out["step"] = k + 1
    ids_a, ids_b = ([t for t in r["ids"] if t != eos] for r in (ours, theirs))
    part = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), None)
    rare = [t for t in ours["drafts"][k] if outside[t]] if k < len(ours["drafts"]) else []
    if rare:
        out["why"] = f"a context token outside S: our draft at step {k + 1} has token {rare[0]}, the export's cannot"
    elif part is not None and part <= 1 + sum(x + 1 for x in a[:k + 1]):
        out["why"] = f"the target's greedy outputs part at token {part + 1} (a float32 near tie)"
    elif k == len(a) - 1 == len(b) - 1 and ours["ids"][-1:] == [eos]:
        out["why"] = f"the stop: end of sequence in the last step (ours accepted {a[k]}, vLLM {b[k]}: it counts " \
                     "drafts past it)"
    else:
        out["why"] = f"unexplained: step {k + 1}, ours accepted {a[k] if k < len(a) else '-'}, " \
                     f"vLLM {b[k] if k < len(b) else '-'}"
    return out


def crosscheck(engine, name: str, server, prompts, max_tokens: int) -> dict:
    """Each prompt on both engines at the server's γ (fixed at its start), compared (`compare_steps`), and counts."""
    gamma = server.variant.speculative["num_speculative_tokens"]
    draft = engine.registry.get(engine.registry.draft_for(engine.registry.models[name]).name)
    outside = np.ones(draft.cfg.vocab_size, bool)
    subset = getattr(draft.model, "lm_head_ids", None)
    if subset is not None:
        outside[subset] = False
    else:
        outside[:] = False
    eos = engine.registry.models[name].tokenizer.eos_token_id
    rows = []
    for prompt in prompts:
        ours, theirs = our_steps(engine, name, prompt, max_tokens, gamma), vllm_steps(server, prompt, max_tokens)
        rows.append({"prompt": prompt, **compare_steps(ours, theirs, outside, max_tokens, gamma, eos),
                     "ours": ours["accepted"], "vllm": theirs["accepted"], "same_output":
                     [t for t in ours["ids"] if t != eos] == [t for t in theirs["ids"] if t != eos]})
    return {"gamma": gamma, "max_tokens": max_tokens, "prompts": rows, "equal": sum(r["equal"] for r in rows),
            "equal_at_stop": sum(r["equal_at_stop"] for r in rows),
            "unexplained": sum(bool(r["why"]) and r["why"].startswith("unexplained") for r in rows)}


def crosscheck_table(r: dict) -> tuple[list, list, str]:
    """`crosscheck`'s result as a table: header, a row per prompt whose difference is not the stop's (the caption
    counts the others), caption (one row saying why, where skipped)."""
    if "skipped" in r:
        return ["vLLM's draft_model with our draft model"], [[f"not measured: {r['skipped']}"]], ""
    rows = [[p["prompt"][:40], "{} / {}".format(*p["steps"]), "{} / {}".format(*p["accepted"]), p["equal"],
             p["equal_at_stop"], p["why"]] for p in r["prompts"] if not p["equal_at_stop"]]
    return (["question", "steps ours / vLLM", "accepted ours / vLLM", "equal", "at our stop", "why not"], rows,
            f"vLLM's draft_model with our draft model (its export), γ = {r['gamma']}, greedy, {r['max_tokens']} tokens: "
            f"per-step accepted lists equal on {r['equal']} of {len(r['prompts'])} as sent, {r['equal_at_stop']} with "
            f"vLLM's stop read our way, {r['unexplained']} unexplained")


def on_server(server, work) -> dict:
    """work(server) on a vLLM server this starts and stops: its result, or {"skipped": why} where vLLM did not start
    or a request failed (RuntimeError)."""
    server.start()
    try:
        if not run_coroutine(server.wait_ready()):
            return {"skipped": f"vLLM did not start: {server.error}"}
        return work(server)
    except RuntimeError as e:
        return {"skipped": str(e)}
    finally:
        server.stop()
