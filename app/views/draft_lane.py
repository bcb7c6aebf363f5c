"""The draft lane's state: one round's drafts, each one's verdict and the token that ends the round, built from
the draft, token and round events (app/views/html.py renders it with the `lane` macro)."""
from __future__ import annotations

NO_MATCH = {"ngram": "no draft: the n-gram was not found earlier, the target decodes one token",
            "suffix": "no draft: nothing in the suffix trees follows the latest tokens often enough, the target "
                      "decodes one token"}                                              # a lookup's empty round


def drafted(e) -> dict:
    """The lane of a `draft` event, every draft unverified (suffix decoding's frequency scores beside them)."""
    scores = (e.origin or {}).get("probs") or [None] * len(e.tokens)
    return {"round": e.round, "method": e.method, "final": None, "why": "", "verdict": "", "origin": e.origin,
            "drafts": [{"text": t["text"], "q": t["q"], "status": "unverified", "accept_prob": None, "r": None,
                        "score": score} for t, score in zip(e.tokens, scores)]}


def token_verdict(lane: dict | None, e, external: bool) -> dict:
    """The lane after a `token` event: a draft's verdict, or the round's own token (a round without a draft
    starts a lane of its own)."""
    if lane is None or lane["round"] != e.round:
        lane = {"round": e.round, "method": "none", "drafts": [], "final": None, "verdict": "",
                "why": "no draft: the target decodes one token"}
    if e.status in ("accepted", "rejected") and e.position <= len(lane["drafts"]):
        lane["drafts"][e.position - 1].update(status=e.status, accept_prob=e.accept_prob, r=e.r)
    elif external and e.status == "accepted":      # vLLM: its accepted drafts come as the step's tokens
        lane["method"] = "vLLM"
        lane["drafts"].append({"text": e.text, "q": None, "status": "accepted", "accept_prob": None, "r": None})
    else:
        lane["final"] = e
    return lane


def round_ended(lane: dict, e, external: bool, method: str | None) -> None:
    """The round's verdict line, once its `round` event has come (`method`: the one the form asked for)."""
    if external and e.num_draft_tokens:
        vllm_lane(lane, e)
    elif lane["drafts"]:
        lane["verdict"] = (f"{e.num_accepted} of {e.num_draft_tokens} accepted"
                           + (", bonus token" if e.num_accepted == e.num_draft_tokens else ", resampled")
                           + f" · {e.verify_tokens} positions in one target forward")
    elif lane["method"] == "none" and method in NO_MATCH:
        lane["why"] = NO_MATCH[method]


def vllm_lane(lane: dict, e) -> None:
    """A vLLM step in the draft lane: the drafts it accepted (the step's first tokens), its rejected ones as a
    count (vLLM does not send them), then its own token, resampled or a bonus."""
    rejected = e.num_draft_tokens - e.num_accepted
    lane["method"] = "vLLM"
    lane["drafts"] += [{"text": "?", "q": None, "status": "rejected", "accept_prob": None, "r": None}] * rejected
    lane["verdict"] = (f"vLLM drafted {e.num_draft_tokens}, accepted {e.num_accepted}"
                       + (", bonus token" if not rejected else ", resampled")
                       + (f" · its {rejected} rejected draft(s) shown as ?: vLLM does not send them" if rejected else ""))
