"""What a session reports beside its output: each round's events and token-inspector figures, its statistics
(vLLM's definitions, engine/serving/metrics.py), its KV blocks, metrics and summary. Made from what a round did,
after it did it; nothing here changes decoding."""
from __future__ import annotations

from ..kv.dtypes import kv_bytes_per_token
from ..kv.runner import PagedRunner
from ..spec_decode.draft import Draft
from ..spec_decode.inspector import Inspector
from ..spec_decode.sampling import top_k_rows
from ..spec_decode.tree_verify import TreeVerification
from ..spec_decode.verify import Verification
from .events import DraftProposed, Event, KVBlocks, RoundDone, TokenResult
from .metrics import SpecDecodeStats


def verdict_nodes(tree: TreeVerification) -> list[int | None]:
    """The tree node of each of a tree verification's verdicts, in their order: the accepted path, the children of
    its end tried there and rejected, then None for the resampled or bonus token (engine/spec_decode/tree_verify.py
    keeps only those verdicts)."""
    end = tree.path[-1] if tree.path else -1
    return [*tree.path, *(t.node for t in tree.tries.get(end, []) if not t.accepted), None]


class SessionFigures:
    """The figures of one session (`session`, read only: its tokens, settings, runners and models).

    NOTE: `stats` counts a round's forwards as they run (the session calls `draft_forward` and `target_forward`),
    and the rest of the round once it is done (`round_events`)."""

    def __init__(self, session):
        self.session = session
        self.stats = SpecDecodeStats()
        self.inspector = Inspector(session.tokenizer)
        self.tree_slots: dict | None = None      # this round's token tree in the target's cache, for its kv event

    # --- a round's events -------------------------------------------------------------------------------
    def token_events(self, round_no: int, draft: Draft, logits, v: Verification, texts: list[str]) -> list[Event]:
        """A verification's token events, in order, without those the output stopped before (EOS inside a
        round); `texts`: what each appended token added to the output stream."""
        token_text = self.session.tokenizer.token_text
        events = [TokenResult(round_no, v.position, v.token_id, token_text(v.token_id), v.status, None, None,
                              v.accept_prob, v.r) for v in v.verdicts]
        if v.tree is not None:
            tried = self.sibling_tries(v.tree)
            for event, node in zip(events, verdict_nodes(v.tree), strict=True):
                event.node, event.siblings = node, tried[event.position - 1]
        self.inspector.add(events, logits, v, draft)
        emitted = [e for e in events if e.status != "rejected"]
        for event, text in zip(emitted, texts):
            event.text = text
            self.stats.emit(event.status)
        dropped = {id(e) for e in emitted[len(texts):]}
        return [e for e in events if id(e) not in dropped]

    def round_events(self, round_no: int, method: str, draft: Draft, draft_ms: float, logits, target_ms: float,
                     v: Verification, texts: list[str]) -> list[Event]:
        """A round's events: its draft, its tokens, and the round's figures."""
        events: list[Event] = []
        if draft:
            self.stats.record_round(len(draft), v.num_accepted, v.block)
            token_text = self.session.tokenizer.token_text
            events.append(DraftProposed(round_no, method, [{"id": x, "text": token_text(x), "q": float(draft.q[i, x]),
                                                            "parent": draft.parents[i]}
                                                           for i, x in enumerate(draft.tokens)], draft_ms, draft.origin,
                                        None if v.tree is None else self.tree_shape(draft)))
        events += self.token_events(round_no, draft, logits, v, texts)
        events.append(RoundDone(round_no, len(draft), v.num_accepted, len(v.emitted), len(draft) + 1, target_ms,
                                draft_ms, target_ms + draft_ms, [] if v.tree is None else list(v.tree.status)))
        return events

    # --- the KV caches, metrics, summary ------------------------------------------------------------------
    def drain_block_events(self) -> list[dict]:
        """Take this session's block events from the pools it uses; other sessions' stay for them. (A copy of
        the pools: another thread may add one meanwhile.)"""
        s = self.session
        return [{"kind": e.kind, "block_id": e.block_id, "pool": e.pool}
                for mgr in list(s.engine.managers.values()) for e in mgr.pool.drain_events(s.seq_ids)]

    def kv_event(self) -> KVBlocks:
        s, pools = self.session, []
        drafter = "eagle" if s.proposer is not None and s.proposer.method == "eagle" else "draft"  # a head's pool
        for role, runner in (("target", s.target), (drafter, s.draft_runner)):
            if isinstance(runner, PagedRunner):
                pools.append(runner.manager.snapshot().drawn(role, runner.seq.block_table))
        events, tree, self.tree_slots = self.drain_block_events(), self.tree_slots, None
        if tree is not None:                   # the scratch blocks that emptied when the path was kept
            held = {r["block_id"] for r in tree["rows"]}
            tree["freed_blocks"] = sorted({e["block_id"] for e in events if e["kind"] == "free"
                                           and e["pool"] == tree["pool"] and e["block_id"] in held})
        return KVBlocks(events, pools, tree)

    def tree_scratch(self, kept_rows) -> None:
        """Note a token tree's scratch rows in the target's paged cache, after its forward and before
        `keep_tree_path`: each row (the root's, row 0, then node i's, row i + 1) with the position, block and
        offset its K/V were written to, and where it is kept (kept_rows[i] moves to start + i) or None: freed."""
        runner = self.session.target
        if not isinstance(runner, PagedRunner) or runner.seq.tree_start is None:
            return
        seq, bs = runner.seq, runner.manager.block_size
        start, table, kept = seq.tree_start, seq.block_table, {int(r): i for i, r in enumerate(kept_rows)}
        self.tree_slots = {"pool": runner.manager.pool.name, "start": start, "block_size": bs, "rows": [
            {"row": r, "node": r - 1 if r else None, "position": start + r, "block_id": int(table[(start + r) // bs]),
             "offset": (start + r) % bs, "kept_at": start + kept[r] if r in kept else None}
            for r in range(seq.num_tokens - start)]}

    def kv_figures(self) -> dict:
        s = self.session
        settings, cfg = s.settings, s.target_lm.cfg
        bpt = kv_bytes_per_token(cfg, settings.kv_cache_dtype) if settings.kv_cache else 0
        held = s.target.num_tokens if settings.kv_cache else 0
        blocks = len(s.target.seq.blocks) if isinstance(s.target, PagedRunner) else 0
        return {"dtype": settings.kv_cache_dtype if settings.kv_cache else "none",
                "num_kv_heads": cfg.num_key_value_heads,
                "block_size": settings.block_size, "bytes_per_token": bpt, "bytes_used": held * bpt,
                "blocks_allocated": blocks, "bytes_allocated": blocks * settings.block_size * bpt}

    def draft_kv_bytes(self) -> int | None:
        """Bytes held by the drafter's own cache (a draft model's or the EAGLE head's: the draft pool); None
        when the drafter keeps none (n-gram lookup, Medusa, plain decoding)."""
        runner = self.session.draft_runner
        return runner.num_tokens * runner.manager.bytes_per_token if isinstance(runner, PagedRunner) else None

    def metrics(self) -> dict:
        """kv_cache_bytes, kv_bytes_per_token and kv_blocks_used are the target's (the contract's kv_cache);
        draft_kv_cache_bytes the draft pool's, beside them."""
        s = self.session
        m = self.stats.summary(s.num_output_tokens)
        kv = self.kv_figures()
        m.update(kv_cache_bytes=kv["bytes_used"], kv_bytes_per_token=kv["bytes_per_token"],
                 kv_blocks_used=kv["blocks_allocated"], draft_kv_cache_bytes=self.draft_kv_bytes(),
                 num_output_tokens=s.num_output_tokens, num_speculative_tokens=s.k,
                 schedule_state=s.schedule.report())
        return m

    def draft_tree(self) -> dict | None:
        """The shape of the drafts (SGLang's settings): children per expanded node (1: a chain), depth (γ), and
        nodes verified at most; None without a drafter."""
        s = self.session
        if s.proposer is None:
            return None
        return {"topk": s.settings.speculative_eagle_topk, "depth": s.settings.num_speculative_tokens,
                "num_draft_tokens": s.settings.num_draft_tokens}

    def sibling_tries(self, tree: TreeVerification) -> list[list[dict]]:
        """Per position of a tree's round, the children tried at its parent node (the root, then the path's nodes),
        in order, with the top-5 of the residual each rejection left (what the token inspector shows beside them)."""
        text = self.session.tokenizer.token_text
        out = []
        for parent in [-1, *tree.path]:
            row = []
            for t in tree.tries.get(parent, []):
                top = [] if t.residual is None else [[x, text(x), prob] for x, prob in top_k_rows(t.residual[None])[0]]
                row.append({"node": t.node, "id": t.token, "text": text(t.token), "p": t.p, "q": t.q,
                            "accept_prob": t.accept_prob, "r": t.r, "accepted": t.accepted, "residual_top": top})
            out.append(row)
        return out

    def tree_shape(self, draft: Draft) -> dict:
        """A drafted tree's shape, as the draft lane's caption gives it: the settings' top-k and budget, and the
        depth this tree reached (a lookup's tree, or a budget spent wide, may stop short of γ)."""
        settings = self.session.settings
        return {"topk": settings.speculative_eagle_topk, "depth": int(draft.depths.max()),
                "num_draft_tokens": settings.num_draft_tokens}

    def summary(self) -> dict:
        s = self.session
        out_ids, tokenizer, cfg = s.tokens[len(s.prompt_ids):], s.tokenizer, s.target_lm.cfg
        m = self.stats.summary(s.num_output_tokens)
        return {
            "text": tokenizer.decode(out_ids), "num_output_tokens": len(out_ids),
            "finish_reason": s.finish_reason,
            "tokens": [{**t, "text": text} for t, text in   # stream pieces: joined, they are `text`
                       zip(self.stats.token_statuses(tokenizer, out_ids), tokenizer.stream_texts(out_ids))],
            **m, "draft_tree": self.draft_tree(), "kv_cache": self.kv_figures(),
            "model": {"name": s.target_lm.name, "num_hidden_layers": cfg.num_hidden_layers,
                      "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
                      "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                      "vocab_size": cfg.vocab_size},
            "draft_model": s.draft_lm.name if s.draft_lm and s.settings.method == "draft_model" else None,
            "settings": s.settings.model_dump(),
        }
