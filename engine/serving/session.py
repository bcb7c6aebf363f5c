"""A generation session: prompt + settings in, a generator of typed events out.

    session = GenerationSession(engine, "def main(", {"method": "draft_model"})
    for event in session.events():
        ...                                   # render; call session.update_settings({...}) any time

NOTE (invariants between rounds):
- `tokens` = prompt + output. The target runner holds K/V for tokens[:-1]: the last token is fed at
  the start of the next round, together with the round's draft tokens (k+1 positions, one forward).
- The draft runner holds a prefix of `tokens` (it is rolled back after every verification).
- Settings changed with `update_settings` are validated at once and applied at the next round
  boundary, which a SettingsApplied event reports.
- Engine time (every figure shown) counts only this session's own work on its engine clock
  (engine/serving/clock.py): its forwards, drafting, verification and sampling; never what its driver does
  between its steps (other sessions, teaching jobs, pacing, rendering, network).

By concern: this module holds the round loop; engine/serving/live_settings.py the settings changed while it runs,
engine/spec_decode/inspector.py the token inspector's annotations, engine/serving/session_figures.py its metrics and summary.
"""
from __future__ import annotations

import itertools
import threading
import uuid
import weakref
from typing import Iterator

import numpy as np

from ..kv.block_pool import KVCacheFullError
from ..kv.runner import ROUND_BOUNDARY, ForwardRequest, PagedRunner, RecomputeRunner, clock_for
from ..model.chat import marked_prompt_tokens
from ..model.llama import ContextLengthError
from ..model.tokenizer import StreamDecoder
from ..spec_decode.heads import EagleProposer, FeatureLog, MedusaProposer
from ..spec_decode.inspector import InspectorAnnotations, Unshown
from ..spec_decode.proposers import DraftModelProposer, NgramProposer
from ..spec_decode.sampling import probs_from_logits, sample
from ..spec_decode.verify import verify, verify_greedy
from .events import Done, DraftProposed, Error, Event, Metrics, Prefill, RoundDone, Started, TokenResult
from .clock import EngineClock
from .live_settings import LiveSettings, pool_setting
from .metrics import SpecDecodeStats
from .registry import InferenceEngine, LoadedModel
from .request_fit import unmet
from .session_figures import SessionFigures
from .settings import MAX_PROMPT_CHARS, GenerationSettings, SettingsError

MAX_GAMMA = 16
_ids = itertools.count(1)


class GenerationSession(LiveSettings, InspectorAnnotations, SessionFigures):
    def __init__(self, engine: InferenceEngine, prompt: str, settings: GenerationSettings | dict | None = None,
                 session_id: str | None = None):
        if not isinstance(settings, GenerationSettings):
            settings = GenerationSettings.parse(settings or {})
        if not prompt:
            raise SettingsError("prompt", "must not be empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise SettingsError("prompt", f"at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")
        self.engine, self.settings = engine, settings
        self.id = session_id or uuid.uuid4().hex[:12]
        try:
            self.target_lm = engine.registry.get(settings.model)
        except KeyError as e:
            raise SettingsError("model", str(e.args[0])) from None
        if self.target_lm.role != "target":
            raise SettingsError("model", f"{settings.model!r} is a draft model; choose a target")
        if (why := unmet(engine.registry, self.target_lm, settings)) is not None:    # chat, KV heads, method
            raise why
        self.variants = engine.registry.variants(self.target_lm)
        if settings.num_kv_heads is not None:
            self.target_lm = self.variants[settings.num_kv_heads]
        self.tokenizer = self.target_lm.tokenizer
        self.draft_lm = engine.registry.draft_for(self.target_lm)
        # chat: the prompt becomes the user's turn in the model's chat template (engine/model/chat.py)
        text = self.tokenizer.chat_template.prompt(prompt) if settings.chat else prompt
        self.prompt_ids = self.tokenizer.encode(text)
        self._prompt_text = text
        self._user_span = self.tokenizer.chat_template.user_span(prompt) if settings.chat else (0, len(text))
        ctx = self.target_lm.cfg.max_position_embeddings
        if len(self.prompt_ids) >= ctx:
            raise SettingsError("prompt", f"{len(self.prompt_ids)} tokens; the model's context is {ctx}")
        self.unknown_characters = self.tokenizer.unknown_characters(prompt)
        self.tokens: list[int] = list(self.prompt_ids)
        self.rng = np.random.default_rng(settings.seed)
        self.k = settings.num_speculative_tokens
        self.stats = SpecDecodeStats()
        self.clock = EngineClock(clock_for(self.target_lm.model))
        self.round = 0
        self.finish_reason: str | None = None
        self.target = None
        self.proposer = None
        self._pending: dict = {}
        self._pending_lock = threading.Lock()
        self._cancel = threading.Event()
        self._closed = False
        self._seq_ids: set = set()
        self._unshown: list[Unshown] = []
        self.features = FeatureLog(self.target_lm.cfg.hidden_size)   # the target's hidden states, for heads
        # output text, token by token: a byte-level token may end inside a character (engine/model/tokenizer.py)
        self._stream = StreamDecoder(self.tokenizer)
        # the KV pools this session uses, held against the server's KV memory budget until it closes (or, dropped
        # without closing, is collected); a pool that cannot fit refuses the start here (live_settings.py)
        self._pool_claim = engine.pools.claim()
        self._pool_finalizer = weakref.finalize(self, self._pool_claim.dropped)
        self._applying: GenerationSettings | None = None
        self._claim_pools(pool_setting(settings), settings)
        self._ensure_pools(settings)

    # --- control, callable from any thread ---------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        """Free every block this session holds (idempotent)."""
        with self.engine.lock:
            if self._closed:
                return
            self._closed = True
            for r in (self.target, getattr(self.proposer, "runner", None)):
                if r is not None:
                    r.free()
            self._drain_block_events()
            self._pool_claim.release()
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
            self._ensure_pools(self.settings)
            t = clock.now()
            out = yield from self._prefill()
            self.stats.add_engine_time(clock.now() - t, first_token=True)
            self._annotate()
            yield from out + self._after_round()
            while self.finish_reason is None:
                yield ROUND_BOUNDARY
                if self._cancel.is_set():
                    self.finish_reason = "cancelled"
                    break
                new_settings = self._take_pending()         # with the pools they use made: not engine time
                t = clock.now()
                out = yield from self._apply_pending(new_settings)
                self._settle_pools(new_settings)
                out += yield from self._round()
                self.stats.add_engine_time(clock.now() - t)
                self._annotate()
                yield from out + self._after_round()
            yield Done(self.summary())
        except (KVCacheFullError, ContextLengthError, ValueError) as e:
            self.finish_reason = "error"
            yield Error(str(e))
        finally:
            self.close()

    # --- steps -------------------------------------------------------------------------------------
    def _started(self) -> Started:
        return Started(self.id, self.settings.model_dump(), self.target_lm.describe(),
                       self.draft_lm.describe() if self.draft_lm else None, self._prompt_tokens(),
                       self.unknown_characters)

    def _prompt_tokens(self) -> list[dict]:
        """The prompt's tokens; those of the chat template (outside the user's text) carry "template": True."""
        return marked_prompt_tokens(self.prompt_ids, self.tokenizer.stream_texts(self.prompt_ids), self._prompt_text,
                                    self._user_span)

    def _ensure_pools(self, s: GenerationSettings) -> None:
        """Make the KV pools these settings use before anything is timed: writing a pool's memory
        (engine.kv_cache) is part of no forward and of no settings change. The constructor runs in a server's
        worker thread, so a large model's first pool (SmolLM2: hundreds of MiB) holds up no other session."""
        self.engine.prepare_pools_for(self.target_lm, s)

    def _eagle_head(self, target: LoadedModel) -> LoadedModel:
        return self.engine.registry.heads_for(target)["eagle"]

    def _eagle_manager(self, target: LoadedModel):
        """The EAGLE layer's own pool: float32, 16-token blocks, whatever the target's cache settings."""
        return self.engine.manager(self._eagle_head(target), "auto", 16)

    def _make_runner(self, lm: LoadedModel):
        s = self.settings
        if not s.kv_cache:
            return RecomputeRunner(lm.model)
        runner = PagedRunner(lm.model, self.engine.manager(lm, s.kv_cache_dtype, s.block_size),
                             s.enable_prefix_caching)
        self._seq_ids.add((runner.manager.pool.name, runner.seq.seq_id))
        return runner

    def _make_proposer(self):
        s = self.settings
        if s.method == "draft_model":
            return DraftModelProposer(self._make_runner(self.draft_lm))
        if s.method == "ngram":
            return NgramProposer(self.target_lm.cfg.vocab_size, s.prompt_lookup_min, s.prompt_lookup_max)
        if s.method == "medusa":
            return MedusaProposer(self.engine.registry.heads_for(self.target_lm)["medusa"], self.features)
        if s.method == "eagle":
            head = self.engine.registry.heads_for(self.target_lm)["eagle"]
            runner = PagedRunner(head.model, self._eagle_manager(self.target_lm), prefix_caching=False)
            self._seq_ids.add((runner.manager.pool.name, runner.seq.seq_id))
            return EagleProposer(head, runner, self.features)
        return None

    def _prefill(self):  # generator -> list[Event]
        self.target = self._make_runner(self.target_lm)
        self.proposer = self._make_proposer()
        t = self.clock.now()
        logits = (yield ForwardRequest(self.target, self.tokens, last_only=True))[-1]
        ms = (self.clock.now() - t) * 1e3
        self.features.record(self.target)
        self.stats.target_forward(ms, len(self.tokens), prefill=True)
        events: list[Event] = [Prefill("target", len(self.tokens), self.target.cached_tokens, ms)]
        self.target.commit()
        self.features.share(self.target)
        t, p = self._sample_target(logits)
        events.append(self._target_token(t, logits, p))
        self._emit([t], ["target"], events[-1:])
        return events

    def _round(self):  # generator -> list[Event]
        """One speculative round (or one plain decode step when nothing is proposed)."""
        self.round += 1
        s = self.settings
        remaining = s.max_tokens - self.num_output_tokens
        room = self.target_lm.cfg.max_position_embeddings - len(self.tokens)
        k = min(self.k, remaining - 1, room - 1) if self.proposer is not None else 0
        drafts, q, draft_ms = [], None, 0.0
        events: list[Event] = []
        if k > 0:
            calls_before = self.proposer.forward_calls
            t = self.clock.now()
            drafts, q = yield from self.proposer.propose(self.tokens, k, s.temperature, s.top_p, self.rng,
                                                         s.draft_confidence_threshold)
            draft_ms = (self.clock.now() - t) * 1e3
            self.stats.draft_forward(draft_ms, self.proposer.forward_calls - calls_before)
        if not drafts:
            return events + (yield from self._plain_step(draft_ms))
        events.append(DraftProposed(self.round, self.proposer.method, [
            {"id": x, "text": self.tokenizer.token_text(x), "q": float(q[i, x])} for i, x in enumerate(drafts)],
            draft_ms))
        old_len = len(self.tokens)
        t = self.clock.now()
        logits = yield ForwardRequest(self.target, [self.tokens[-1]] + drafts, causal=s.fault != "no_causal_mask")
        target_ms = (self.clock.now() - t) * 1e3
        self.features.record(self.target)
        self.stats.target_forward(target_ms, len(drafts) + 1)
        greedy = s.temperature == 0
        if greedy:    # point masses on the argmax: verification compares ids, no distributions are built
            p = None
            verdicts, residual = verify_greedy(drafts, logits.argmax(axis=-1).tolist(), logits.shape[-1])
        else:
            p = probs_from_logits(logits, s.temperature, s.top_p)
            verdicts, residual = verify(drafts, q, p, self.rng, s.fault != "unnormalized_residual")
        n_acc = sum(v.status == "accepted" for v in verdicts)
        self.stats.record_round(len(drafts), n_acc)
        shown = [TokenResult(self.round, v.position, v.token_id, self.tokenizer.token_text(v.token_id), v.status,
                             None, None, v.accept_prob, v.r) for v in verdicts]
        # display distributions: at temperature 0 the decision uses point masses; show softmax(T=1)
        display_q = getattr(self.proposer, "display_q", None) if greedy else None
        self._unshown.append(Unshown(shown, logits if greedy else p, greedy,
                                     display_q if display_q is not None else q, display_q is not None, residual))
        events += shown
        emitted = [v for v in verdicts if v.status != "rejected"]
        if s.fault != "no_truncate":          # the fault keeps the rejected drafts' K/V in the cache
            self.target.truncate(old_len + n_acc)
        token_events = [e for e in events if isinstance(e, TokenResult) and e.status != "rejected"]
        n_out = self._emit([v.token_id for v in emitted], [v.status for v in emitted], token_events)
        if n_out < len(token_events):         # stopped at EOS inside the round: later tokens are not output
            events = [e for e in events if all(e is not d for d in token_events[n_out:])]
        self.target.commit()
        self.proposer.rollback(old_len + n_acc)
        if s.num_speculative_tokens_schedule == "heuristic":   # Hugging Face's assistant schedule
            self.k = min(MAX_GAMMA, self.k + 2) if n_acc == len(drafts) else max(1, self.k - 1)
        events.append(RoundDone(self.round, len(drafts), n_acc, len(emitted), len(drafts) + 1, target_ms,
                                draft_ms, target_ms + draft_ms))
        return events

    def _plain_step(self, draft_ms: float):  # generator -> list[Event]
        t = self.clock.now()
        logits = (yield ForwardRequest(self.target, [self.tokens[-1]]))[-1]
        target_ms = (self.clock.now() - t) * 1e3
        self.features.record(self.target)
        self.stats.target_forward(target_ms, 1)
        tok, p = self._sample_target(logits)
        events = [self._target_token(tok, logits, p)]
        self._emit([tok], ["target"], events)
        self.target.commit()
        if self.proposer is not None:
            self.proposer.rollback(len(self.tokens) - 1)
        events.append(RoundDone(self.round, 0, 0, 1, 1, target_ms, draft_ms, target_ms + draft_ms))
        return events

    def _sample_target(self, logits):  # -> (token, p: the sampling distribution, None when greedy)
        s = self.settings
        if s.temperature == 0:      # greedy: the argmax of the logits (what the point mass would give)
            return int(np.argmax(logits)), None
        p = probs_from_logits(logits, s.temperature, s.top_p)
        return sample(p, self.rng), p

    def _target_token(self, tok: int, logits, p) -> TokenResult:
        event = TokenResult(self.round, 1, tok, self.tokenizer.token_text(tok), "target", None, None, None, None)
        self._unshown.append(Unshown([event], (logits if p is None else p)[None], p is None, None, False, None))
        return event

    def _emit(self, new_tokens: list[int], statuses: list[str], token_events: list[TokenResult]) -> int:
        """Append output tokens, stopping exactly at EOS, max_tokens or the context limit; returns how many.

        Each token's event gets the text it adds to the output stream (joined: exactly the decoded output).
        """
        s, eos = self.settings, self.target_lm.cfg.eos_token_id
        n = 0
        for tok, status, event in zip(new_tokens, statuses, token_events):
            n += 1
            self.tokens.append(tok)
            self.stats.emit(status)
            event.text = self._stream.push(tok)
            if eos is not None and tok == eos:
                self.finish_reason = "stop"
            elif self.num_output_tokens >= s.max_tokens:
                self.finish_reason = "length"
            elif len(self.tokens) >= self.target_lm.cfg.max_position_embeddings:
                self.finish_reason = "context"
            if self.finish_reason:
                event.text += self._stream.flush()
                break
        return n

    def _after_round(self) -> list[Event]:
        return [self._kv_event(), Metrics(self.metrics())]

    # --- figures -----------------------------------------------------------------------------------
    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)
