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
            "tree": e.tree, "roots": [],
            "drafts": [{"text": t["text"], "q": t["q"], "status": "unverified", "accept_prob": None, "r": None,
                        "score": score, "parent": t.get("parent", i - 1), "verdict_shown": False}
                       for i, (t, score) in enumerate(zip(e.tokens, scores))]}


def token_verdict(lane: dict | None, e, external: bool) -> dict:
    """The lane after a `token` event: a draft's verdict, or the round's own token (a round without a draft
    starts a lane of its own)."""
    if lane is None or lane["round"] != e.round:
        lane = {"round": e.round, "method": "none", "drafts": [], "final": None, "verdict": "",
                "why": "no draft: the target decodes one token"}
    node = e.node if e.node is not None else e.position - 1        # a tree's node, or a chain's position
    if e.status in ("accepted", "rejected") and node < len(lane["drafts"]):
        lane["drafts"][node].update(status=e.status, accept_prob=e.accept_prob, r=e.r, verdict_shown=True)
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
    elif lane.get("tree") and e.node_status:
        tree_ended(lane, e)
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


TREE_STATUS = {"accepted": "accepted", "rejected": "rejected", "unreached": "unverified"}   # drawn as a chain's


def tree_ended(lane: dict, e) -> None:
    """A token tree's round: each node's verdict from the `round` event (accepted: on the path; rejected: tried
    and refused; unreached: never tried, drawn as a chain's unverified draft), the nodes nested under their
    parents (`roots`), and the resampled or bonus token as the last child of the path's end."""
    drafts = lane["drafts"]
    for d, status in zip(drafts, e.node_status):
        d["status"] = TREE_STATUS[status]
    nodes = [{"index": i, "draft": d, "depth": 1, "children": [], "on_path": d["status"] == "accepted"}
             for i, d in enumerate(drafts)]
    roots, path_end = [], None
    for node in nodes:                                  # topological order: a parent comes before its children
        parent = node["draft"]["parent"]
        if parent is not None and 0 <= parent < len(nodes):
            node["depth"] = nodes[parent]["depth"] + 1
            nodes[parent]["children"].append(node)
        else:
            roots.append(node)
        if node["on_path"]:
            path_end = node
    if lane["final"] is not None:
        final = {"index": None, "final": lane["final"], "depth": path_end["depth"] + 1 if path_end else 1,
                 "children": [], "on_path": True}
        (path_end["children"] if path_end else roots).append(final)
    lane["roots"] = roots
    tried = sum(d["status"] == "rejected" for d in drafts)
    last = lane["final"].status if lane["final"] is not None else "no token"
    lane["verdict"] = (f"path of {e.num_accepted} accepted, {tried} rejected, {len(drafts) - e.num_accepted - tried} "
                       f"never reached, {'bonus token' if last == 'bonus' else last} · {e.verify_tokens} positions "
                       f"in one target forward")
