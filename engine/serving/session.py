"""A generation session: prompt + settings in, a generator of typed events out.

    session = GenerationSession(engine, "def main(", {"method": "draft_model"})
    for event in session.events():
        ...                                   # render; call session.update_settings({...}) any time

NOTE (invariants between rounds):
- `tokens` = prompt + output. The target runner holds K/V for tokens[:-1]: the last token is fed at
  the start of the next round, together with the round's draft tokens (k+1 positions, one forward).
- A proposer's runner holds a prefix of `tokens` (it is rolled back after every verification).
- Settings changed with `update_settings` are validated at once and applied at the next round
  boundary, which a SettingsApplied event reports.
- Engine time (every figure shown) counts only this session's own work on its engine clock
  (engine/serving/clock.py): its forwards, drafting, verification and sampling; never what its driver does
  between its steps (other sessions, teaching jobs, pacing, rendering, network).

The session owns its parts: `live` (engine/serving/live_settings.py) holds the settings changed while it runs,
`figures` (engine/serving/session_figures.py) its events, statistics, inspector figures, metrics and summary. A
round's steps that a teaching fault may replace are hooks (engine/spec_decode/faults.py); proposers keep the
contract of engine/spec_decode/draft.py.
"""
from __future__ import annotations

import threading
import uuid
import weakref
from typing import Iterator

import numpy as np

from ..kv.block_pool import KVCacheFullError
from ..kv.dtypes import kv_bytes_per_token
from ..kv.runner import ROUND_BOUNDARY, ForwardRequest, PagedRunner, RecomputeRunner, clock_for
from ..model.chat import marked_prompt_tokens
from ..model.llama import ContextLengthError
from ..model.tokenizer import StreamDecoder
from ..spec_decode.draft import NO_DRAFT, DraftParams, Proposer
from ..spec_decode.faults import TEACHING_FAULTS
from ..spec_decode.heads import EagleProposer, FeatureLog, MedusaProposer
from ..spec_decode.proposers import DraftModelProposer, NgramProposer
from ..spec_decode.schedule import make_schedule
from ..spec_decode.subset_draft import draft_model_proposer
from ..spec_decode.suffix_caches import suffix_cache_scope
from ..spec_decode.suffix_proposer import SuffixParams, SuffixProposer
from ..spec_decode.verify import verify_draft
from .clock import EngineClock
from .events import Done, Error, Event, Metrics, Prefill, SettingsApplied, Started
from .live_settings import LiveSettings, pool_setting
from .registry import InferenceEngine, LoadedModel
from .request_fit import target_of
from .session_figures import SessionFigures
from .settings import MAX_PROMPT_CHARS, SUFFIX_SETTINGS, GenerationSettings, SettingsError


class GenerationSession:
    def __init__(self, engine: InferenceEngine, prompt: str, settings: GenerationSettings | dict | None = None,
                 session_id: str | None = None):
        if not isinstance(settings, GenerationSettings):
            settings = GenerationSettings.parse(settings or {})
        if not prompt:
            raise SettingsError("prompt", "must not be empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise SettingsError("prompt", f"at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")
        self.engine, self.settings, self.id = engine, settings, session_id or uuid.uuid4().hex[:12]
        self.target_lm, self.variants = target_of(engine.registry, settings)
        self.tokenizer = self.target_lm.tokenizer
        self.draft_lm = engine.registry.draft_for(self.target_lm)
        # chat: the prompt becomes the user's turn in the model's chat template (engine/model/chat.py)
        text = self.tokenizer.chat_template.prompt(prompt) if settings.chat else prompt
        self.prompt_ids, self._prompt_text = self.tokenizer.encode(text), text
        self._user_span = self.tokenizer.chat_template.user_span(prompt) if settings.chat else (0, len(text))
        ctx = self.target_lm.cfg.max_position_embeddings
        if len(self.prompt_ids) >= ctx:
            raise SettingsError("prompt", f"{len(self.prompt_ids)} tokens; the model's context is {ctx}")
        self.unknown_characters = self.tokenizer.unknown_characters(prompt)
        self.tokens: list[int] = list(self.prompt_ids)
        self.rng = np.random.default_rng(settings.seed)
        self.schedule = self._new_schedule(settings)
        self.k = self.schedule.k                      # γ of the next round (0: a plain decode step)
        self.clock = EngineClock(clock_for(self.target_lm.model))
        self.suffix_scope = suffix_cache_scope.get()   # whose earlier requests suffix decoding may draft from
        self.round = 0
        self.finish_reason: str | None = None
        self.target = None                            # the target's runner, made at the prefill
        self.proposer: Proposer | None = None         # None: plain decoding
        self.seq_ids: set = set()                     # (pool, sequence) of every runner made: its block events
        self.features = FeatureLog(self.target_lm.cfg.hidden_size)   # the target's hidden states, for heads
        self.figures = SessionFigures(self)
        self.stats = self.figures.stats
        self._cancel = threading.Event()
        self._closed = False
        # output text, token by token: a byte-level token may end inside a character (engine/model/tokenizer.py)
        self._stream = StreamDecoder(self.tokenizer)
        # the KV pools this session uses, held against the server's KV memory budget until it closes (or, dropped
        # without closing, is collected); a pool that cannot fit refuses the start here
        self.live = LiveSettings(engine)
        self._pool_finalizer = weakref.finalize(self, self.live.claim.dropped)
        self.live.hold(pool_setting(settings), self.target_lm, settings)
        # its pools made before anything is timed (writing a pool's memory is part of no forward), here in the
        # server's worker thread, so that a large model's first pool holds up no other session
        self.engine.prepare_pools_for(self.target_lm, settings)

    # --- control, callable from any thread ---------------------------------------------------------
    def update_settings(self, changes: dict) -> GenerationSettings:
        """Validate now (raises SettingsError), apply at the next round boundary."""
        return self.live.update(changes, self.settings, self.target_lm)

    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        """Free every block this session holds (idempotent)."""
        with self.engine.lock:
            if self._closed:
                return
            self._closed = True
            self.engine.running.leave(self.id)
            if self.target is not None:
                self.target.free()
            if self.proposer is not None:
                self.proposer.free()
            self.figures.drain_block_events()
            self.live.claim.release()
            self._pool_finalizer.detach()

    # --- the generators ----------------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        """Run the session alone: every forward is executed at once, each round under the engine lock.

        Events of a round are yielded after the round, outside the lock, so a slow consumer never holds
        the engine (and never counts in engine time).
        """
        gen, value, error, out = self.steps(), None, None, []
        lock = self.engine.lock
        lock.acquire()
        try:
            while True:
                try:   # a failed forward (e.g. the pool is full) is raised where the session asked for it
                    item = gen.throw(error) if error is not None else gen.send(value)
                except StopIteration:
                    break
                value = error = None
                if isinstance(item, ForwardRequest):
                    try:
                        value = item.run()
                    except Exception as e:  # noqa: BLE001 - handed back to the session, which decides
                        error = e
                elif item is ROUND_BOUNDARY:
                    lock.release()
                    try:
                        yield from out
                    finally:
                        out = []
                        lock.acquire()
                else:
                    out.append(item)
        finally:
            lock.release()
            gen.close()
        yield from out

    def steps(self):
        """The session as a coroutine for a scheduler (engine/serving/scheduler.py). It yields:
        - Event: something to show;
        - ForwardRequest: a forward to run; send its logits back (several sessions' requests may run as
          one batched computation), having set its `seconds`;
        - ROUND_BOUNDARY: a round is complete; resume when the next round may start (pacing).
        """
        return self.clock.timed(self._steps())

    def _steps(self):
        clock = self.clock
        try:
            yield self._started()
            self.engine.prepare_pools_for(self.target_lm, self.settings)
            t = clock.now()
            out = yield from self._prefill()
            self.stats.add_engine_time(clock.now() - t, first_token=True)
            self.figures.inspector.annotate()
            yield from out + self._after_round()
            while self.finish_reason is None:
                yield ROUND_BOUNDARY
                if self._cancel.is_set():
                    self.finish_reason = "cancelled"
                    break
                new_settings = self.live.take(self.settings, self.target_lm)   # pools made: not engine time
                t = clock.now()
                out = yield from self._apply(new_settings)
                self.live.settle(new_settings, self.settings, self.target_lm)
                out += yield from self._round()
                self.stats.add_engine_time(clock.now() - t)
                self.figures.inspector.annotate()
                yield from out + self._after_round()
            last = Done(self.figures.summary())
        except (KVCacheFullError, ContextLengthError, ValueError) as e:
            self.finish_reason = "error"
            last = Error(str(e))
        finally:
            self.close()        # before the last event is sent: a client acting on it finds blocks and pools released
        yield last

    # --- a round -----------------------------------------------------------------------------------
    def _round(self):  # generator -> list[Event]
        """One round: draft -> verify -> accept -> commit. Nothing drafted (plain decoding, no match, no room
        left) makes it a plain decode step: one position verified, the target's own token."""
        self.round += 1
        s, fault = self.settings, TEACHING_FAULTS[self.settings.fault]
        draft, draft_ms = yield from self._draft()
        context = len(self.tokens)                          # the target holds K/V for context - 1 tokens
        logits, target_ms = yield from self._target_forward([self.tokens[-1]] + draft.tokens, fault.verification_mask(
            draft), positions=draft.verification_positions(context - 1))    # a tree's: root + depth
        verification = fault.verify(draft, logits, s.temperature, s.top_p, self.rng, s.rejection_sample_method)
        accepted = verification.num_accepted
        if verification.tree is not None:                  # the accepted path's K/V kept in order, the rest freed
            self.figures.tree_scratch(verification.tree.kept_rows)
            self.target.keep_tree_path(verification.tree.kept_rows)
            self.features.record(self.target)              # and its hidden states, where the path's tokens now are
        else:
            fault.truncate(self.target, context + accepted)    # the rejected drafts' K/V leave the cache
        texts = self._append(verification.emitted)
        self.target.commit()
        if self.proposer is not None:
            self.proposer.rollback(context + accepted)
        self.schedule.observe(len(draft), accepted)
        self.k = self.schedule.k
        method = self.proposer.method if self.proposer is not None else "none"
        return self.figures.round_events(self.round, method, draft, draft_ms, logits, target_ms, verification, texts)

    def _draft(self):  # generator -> (Draft, its engine time in ms)
        """The proposer's draft: at most k tokens, fewer where max_tokens or the context end sooner (the round's
        bonus or replacement token takes one more place)."""
        s, room = self.settings, self.target_lm.cfg.max_position_embeddings - len(self.tokens) - 1
        k = min(self.k, s.max_tokens - self.num_output_tokens - 1, room)
        if self.proposer is None or k <= 0:
            return NO_DRAFT, 0.0
        t = self.clock.now()
        draft = yield from self.proposer.propose(self.tokens, DraftParams.of(s, k, min(s.num_draft_tokens, room)),
                                                 self.rng)
        ms = (self.clock.now() - t) * 1e3
        self.stats.draft_forward(ms, draft.forward_calls)
        return draft, ms

    def _target_forward(self, tokens, mask=None, prefill: bool = False, positions=None):  # -> (logits, engine ms)
        t = self.clock.now()
        logits = yield ForwardRequest(self.target, tokens, mask=mask, last_only=prefill, positions=positions)
        ms = (self.clock.now() - t) * 1e3
        self.features.record(self.target)
        self.stats.target_forward(ms, len(tokens), prefill=prefill)
        return logits, ms

    def _append(self, new_tokens: list[int]) -> list[str]:
        """Append output tokens, stopping exactly at EOS, max_tokens or the context limit. Returns the text each
        appended token adds to the output stream (joined: exactly the decoded output)."""
        eos, texts = self.target_lm.cfg.eos_token_id, []
        for tok in new_tokens:
            self.tokens.append(tok)
            texts.append(self._stream.push(tok))
            if eos is not None and tok == eos:
                self.finish_reason = "stop"
            elif self.num_output_tokens >= self.settings.max_tokens:
                self.finish_reason = "length"
            elif len(self.tokens) >= self.target_lm.cfg.max_position_embeddings:
                self.finish_reason = "context"
            if self.finish_reason:
                texts[-1] += self._stream.flush()
                break
        return texts

    # --- the start ---------------------------------------------------------------------------------
    def _new_schedule(self, s: GenerationSettings):   # `batch`: γ by the sessions on its model, this one included
        name = self.target_lm.name
        return make_schedule(s.num_speculative_tokens_schedule, s.num_speculative_tokens, (name, s.method),
                             lambda: self.engine.running.batch_size(name, self.id))

    def _started(self) -> Started:
        self.engine.running.join(self.target_lm.name, self.id)      # generating on its model until its close
        return Started(self.id, self.settings.model_dump(), self.target_lm.describe(),
                       self.draft_lm.describe() if self.draft_lm else None, self._prompt_tokens(),
                       self.unknown_characters)

    def _prompt_tokens(self) -> list[dict]:
        """The prompt's tokens; those of the chat template (outside the user's text) carry "template": True."""
        return marked_prompt_tokens(self.prompt_ids, self.tokenizer.stream_texts(self.prompt_ids), self._prompt_text,
                                    self._user_span)

    def _prefill(self):  # generator -> list[Event]
        """The prompt's forward and the first token, sampled as in plain decoding."""
        self.target = self._make_runner(self.target_lm)
        self.proposer = self._make_proposer()
        logits, ms = yield from self._target_forward(self.tokens, prefill=True)
        prefill = Prefill("target", len(self.tokens), self.target.cached_tokens, ms)
        self.target.commit()
        self.features.share(self.target)
        s = self.settings
        verification = verify_draft(NO_DRAFT, logits, s.temperature, s.top_p, self.rng)
        texts = self._append(verification.emitted)
        return [prefill] + self.figures.token_events(self.round, NO_DRAFT, logits, verification, texts)

    def _make_runner(self, lm: LoadedModel):
        s = self.settings
        if not s.kv_cache:
            return RecomputeRunner(lm.model)
        return self._paged(lm.model, self.engine.manager(lm, s.kv_cache_dtype, s.block_size), s.enable_prefix_caching)

    def _paged(self, model, manager, prefix_caching: bool) -> PagedRunner:
        runner = PagedRunner(model, manager, prefix_caching)
        self.seq_ids.add((manager.pool.name, runner.seq.seq_id))
        return runner

    def _make_proposer(self) -> Proposer | None:
        """The proposer of the `method` setting (None: plain decoding)."""
        s = self.settings
        if s.method == "draft_model":      # a shipped draft's weights load on first use (engine/model/shipped_drafts.py)
            return draft_model_proposer(self._make_runner(self.engine.registry.get(self.draft_lm.name)))
        if s.method == "ngram":
            return NgramProposer(self.target_lm.cfg.vocab_size, s.prompt_lookup_min, s.prompt_lookup_max)
        if s.method == "suffix":
            return SuffixProposer(self.engine.suffix_caches, self.target_lm.name, SuffixParams.of(s), self.tokens,
                                  self.target_lm.cfg.vocab_size, self.suffix_scope)
        if s.method == "medusa":
            return MedusaProposer(self.engine.registry.heads_for(self.target_lm)["medusa"], self.features)
        if s.method == "eagle":
            head = self.engine.registry.heads_for(self.target_lm)["eagle"]
            # the EAGLE layer's own pool: float32, 16-token blocks, whatever the target's cache settings
            return EagleProposer(head, self._paged(head.model, self.engine.manager(head, "auto", 16), False),
                                 self.features)
        return None

    # --- settings changed while running ------------------------------------------------------------
    def _apply(self, new: GenerationSettings | None):  # generator -> list[Event]
        """Migrate what changed settings touch: a new target (re-prefilled), re-quantized caches, a new proposer."""
        changed = {} if new is None else {k: v for k, v in new.model_dump().items() if v != getattr(self.settings, k)}
        if not changed:
            return []
        self.settings, notes, t = new, [], self.clock.now()
        if {"num_speculative_tokens", "num_speculative_tokens_schedule", "method"} & changed.keys():
            self.schedule = self._new_schedule(new)
            self.k = self.schedule.k
        if "enable_prefix_caching" in changed:
            for r in (self.target, self.draft_runner):
                if isinstance(r, PagedRunner):
                    r.prefix_caching = new.enable_prefix_caching
        if {"num_kv_heads", "kv_cache"} & changed.keys() or (
                not new.kv_cache and {"kv_cache_dtype", "block_size"} & changed.keys()):
            notes.append((yield from self._new_target(changed)))
        elif {"kv_cache_dtype", "block_size"} & changed.keys() and isinstance(self.target, PagedRunner):
            self.target = self._moved(self.target, self.target_lm)
            draft = self.proposer
            if isinstance(draft, DraftModelProposer) and isinstance(draft.runner, PagedRunner):
                draft.runner = self._moved(draft.runner, self.draft_lm)     # its cache follows the target's
            notes.append(f"KV cache re-quantized to {new.kv_cache_dtype}, block size {new.block_size}: "
                         f"{kv_bytes_per_token(self.target_lm.cfg, new.kv_cache_dtype):,} bytes/token")
        if {"method", "prompt_lookup_min", "prompt_lookup_max"} & changed.keys() or (
                new.method == "suffix" and set(SUFFIX_SETTINGS) & changed.keys()):
            if self.proposer is not None:
                self.proposer.free()
            self.proposer = self._make_proposer()
            notes.append(f"proposer: {new.method}")
        return [SettingsApplied(changed, notes, (self.clock.now() - t) * 1e3)]

    def _new_target(self, changed: dict):  # generator -> a note
        """Another target variant, or the cache switched on or off: the target's runner made anew (and a draft
        model's, whose cache follows it), the context re-prefilled."""
        new = self.settings
        if "num_kv_heads" in changed and new.num_kv_heads is not None:
            self.target_lm = self.variants[new.num_kv_heads]
        self.target.free()
        self.target = self._make_runner(self.target_lm)
        if new.kv_cache:
            yield ForwardRequest(self.target, self.tokens[:-1], last_only=True)   # may run in chunks
            self.features.record(self.target)
            self.target.commit()
            note = f"target {self.target_lm.name} ({self.target_lm.cfg.attention_kind}) re-prefilled " \
                   f"{len(self.tokens) - 1} tokens"
        else:
            self.target.token_ids = list(self.tokens[:-1])   # nothing to compute until the next step
            note = "KV cache off: every step recomputes the whole sequence"
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.free()
            self.proposer = self._make_proposer()
        return note

    def _moved(self, runner: PagedRunner, lm: LoadedModel) -> PagedRunner:
        """The runner's tokens in the pool of the new cache dtype and block size (K/V converted)."""
        moved = runner.move_to(self.engine.manager(lm, self.settings.kv_cache_dtype, self.settings.block_size))
        self.seq_ids.add((moved.manager.pool.name, moved.seq.seq_id))
        return moved

    # --- figures -----------------------------------------------------------------------------------
    def _after_round(self) -> list[Event]:
        return [self.figures.kv_event(), Metrics(self.figures.metrics())]

    @property
    def draft_runner(self):
        """The proposer's own runner (a draft model's, the EAGLE head's), or None."""
        return self.proposer.runner if self.proposer is not None else None

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)
