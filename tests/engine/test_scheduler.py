"""The scheduler: many sessions advanced together, forwards of one model batched, same results."""
from engine.serving.scheduler import Scheduler
from engine.serving.session import GenerationSession

PROMPTS = ["def add(a, b):\n    return a", "class Foo:\n    def __init__(self", "import os\nimport s",
           "for i in range(10):\n    print(i", "x = [1, 2, 3]\ny = x"]
SETTINGS = [{"method": "draft_model", "num_speculative_tokens": 3}, {"method": "none"},
            {"method": "ngram"}, {"method": "draft_model", "num_speculative_tokens": 1, "kv_cache_dtype": "int8"},
            {"method": "draft_model", "temperature": 0.9, "seed": 3}]


def alone(engine, prompt, settings):
    return list(GenerationSession(engine, prompt, {**settings, "max_tokens": 40}).events())[-1].summary["text"]


def run_all(scheduler, sessions, gates=None):
    events = {s.id: [] for s in sessions}
    for s in sessions:
        gate = (gates or {}).get(s.id, lambda: True)
        scheduler.add(s, events[s.id].append, gate)
    steps = 0
    while scheduler.active and steps < 10_000:
        if not scheduler.step():
            break
        steps += 1
    return events


def test_batched_sessions_give_the_same_output_as_alone(family):
    engine = family()
    expected = [alone(engine, p, s) for p, s in zip(PROMPTS, SETTINGS)]
    scheduler = Scheduler()
    sessions = [GenerationSession(engine, p, {**s, "max_tokens": 40}) for p, s in zip(PROMPTS, SETTINGS)]
    events = run_all(scheduler, sessions)
    got = [events[s.id][-1].summary["text"] for s in sessions]
    assert got == expected
    assert scheduler.batches > 0 and scheduler.batched_requests >= 2 * scheduler.batches
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_a_parked_session_waits_while_others_finish(family):
    engine = family()
    scheduler = Scheduler()
    a = GenerationSession(engine, PROMPTS[0], {"max_tokens": 30})
    b = GenerationSession(engine, PROMPTS[1], {"max_tokens": 30})
    gate = {"open": False}
    events = run_all(scheduler, [a, b], gates={a.id: lambda: gate["open"]})
    assert events[b.id][-1].type == "done"
    assert scheduler.active == 1 and [e.type for e in events[a.id]].count("round") == 0   # held after prefill
    gate["open"] = True
    while scheduler.step():
        pass
    assert events[a.id][-1].type == "done" and events[a.id][-1].summary["text"] == alone(engine, PROMPTS[0], {})[:30]


def test_removing_a_session_frees_its_blocks_and_an_error_stays_its_own(family):
    engine = family(blocks_per_pool=12)
    scheduler = Scheduler()
    small = GenerationSession(engine, PROMPTS[2], {"max_tokens": 20})
    huge = GenerationSession(engine, PROMPTS[0] * 6, {"max_tokens": 20})      # 162 tokens: 11 of 12 blocks
    gone = GenerationSession(engine, PROMPTS[3], {"max_tokens": 200})
    events = {s.id: [] for s in (small, huge, gone)}
    for s in (small, huge, gone):
        scheduler.add(s, events[s.id].append)
    for _ in range(3):
        scheduler.step()
    scheduler.remove(gone.id)
    while scheduler.step():
        pass
    assert events[huge.id][-1].type == "error" and "exhausted" in events[huge.id][-1].message
    assert events[small.id][-1].type == "done"
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_each_session_gets_its_own_block_events_from_a_shared_pool(family):
    engine = family()
    scheduler = Scheduler(max_num_batched_tokens=None)   # whole prefills: the sessions run in step, none ends first
    sessions = [GenerationSession(engine, p, {"max_tokens": 40, "method": "none"}) for p in PROMPTS[:3]]
    events = run_all(scheduler, sessions)
    allocated = []
    for s in sessions:
        mine = [k["block_id"] for e in events[s.id] if e.type == "kv" for k in e.events if k["kind"] == "allocate"]
        assert len(mine) >= 3        # ~30 prompt + 40 output tokens: at least 3 blocks of 16, reported here
        allocated += mine
    assert len(allocated) == len(set(allocated))   # plain decoding frees nothing mid-run: no block twice


def test_a_bug_in_one_session_ends_only_that_session(family):
    engine = family()
    scheduler = Scheduler()
    good = GenerationSession(engine, PROMPTS[0], {"max_tokens": 20})
    bad = GenerationSession(engine, PROMPTS[1], {"max_tokens": 20})
    bad._append = None                 # a bug: calling it raises TypeError inside the session's own code
    events = run_all(scheduler, [good, bad])
    assert events[bad.id][-1].type == "error" and "TypeError" in events[bad.id][-1].message
    assert events[good.id][-1].type == "done"
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_a_long_prefill_runs_in_chunks_between_other_sessions_steps_with_the_same_output(family):
    """Chunked prefill: a prompt longer than the step's token budget is prefilled over several steps, a
    `prefill_progress` event after each chunk, while another session's first token comes before the long
    prefill ends; the long generation (greedy, with a draft model that also catches up in chunks) equals
    an unchunked run token for token. Prefix caching is off: the engines must not share blocks."""
    long_prompt = "def parse(line):\n    return line.split(),\n" * 6           # 246 characters: tokens
    settings = {"method": "draft_model", "enable_prefix_caching": False}
    expected = alone(family(), long_prompt, settings)
    engine = family()
    scheduler = Scheduler(max_num_batched_tokens=32)
    long = GenerationSession(engine, long_prompt, {**settings, "max_tokens": 40})
    short = GenerationSession(engine, PROMPTS[1], {"max_tokens": 8, "method": "none"})
    order = []
    for s in (long, short):
        scheduler.add(s, lambda e, sid=s.id: order.append((sid, e)))
    while scheduler.step():
        pass
    events = [e for sid, e in order if sid == long.id]
    assert events[-1].summary["text"] == expected
    progress = [e for e in events if e.type == "prefill_progress" and e.model == "target"]
    assert len(progress) >= len(long.prompt_ids) // 32 - 1 and scheduler.chunks >= len(progress)
    computed = [e.num_computed for e in progress]
    assert computed == sorted(set(computed)) and all(e.num_tokens == len(long.prompt_ids) for e in progress)
    assert any(e.type == "prefill_progress" and e.model == "draft" for e in events)   # the draft's catch-up
    for model in ("target", "draft"):               # each chunked prefill's end is reported, once, as the last
        mine = [e for e in events if e.type == "prefill_progress" and e.model == model]
        assert [e.num_computed == e.num_tokens for e in mine] == [False] * (len(mine) - 1) + [True], model
    ends = [i for i, e in enumerate(events) if e.type == "prefill_progress" and e.num_computed == e.num_tokens]
    assert events[ends[0] + 1].type == "prefill"                # the target's: right before its `prefill`
    assert events[ends[1] + 1].type == "draft"                  # the draft's: right before round 1's proposal
    first_short_token = next(i for i, (sid, e) in enumerate(order) if sid == short.id and e.type == "token")
    long_prefill_done = next(i for i, (sid, e) in enumerate(order) if sid == long.id and e.type == "prefill")
    assert first_short_token < long_prefill_done
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_a_prompt_the_prefix_cache_makes_short_runs_in_the_step_it_arrives(family):
    """A prompt longer than the step's budget whose cached prefix leaves fewer tokens than the budget is prefilled
    whole in the first step after it arrives, beside a long prefill's chunk (it once fell between "whole" and
    "chunked" and waited a step: a chunk's time, hundreds of ms on SmolLM2)."""
    engine = family()
    prompt = "def main(argv):\n    "                         # 20 characters: one cached block of 16, 4 left
    list(GenerationSession(engine, prompt, {"max_tokens": 2, "method": "none"}).events())   # fills the cache
    scheduler = Scheduler(max_num_batched_tokens=8)
    long = GenerationSession(engine, "def parse(line):\n    return line.split(),\n" * 6,
                             {"max_tokens": 2, "method": "none", "enable_prefix_caching": False})
    events = []
    scheduler.add(long, lambda e: None)
    assert scheduler.step() and scheduler.chunks == 1
    short = GenerationSession(engine, prompt, {"max_tokens": 2, "method": "none"})
    assert len(short.prompt_ids) > 8
    scheduler.add(short, events.append)
    scheduler.step()
    assert [e.type for e in events][:3] == ["started", "prefill", "token"], [e.type for e in events]
    assert scheduler.chunks == 2                           # and the long prefill went on in that step
    while scheduler.step():
        pass
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())


def test_chunks_sized_in_time_grow_from_the_smallest_by_the_models_measured_speed(family):
    """Without a token budget a chunk is about `chunk_seconds` of the model's prefill as measured: the first
    MIN_CHUNK tokens (nothing measured yet), the next ones larger while a chunk takes less than that; a chunk
    time far beyond a tiny model's whole prefill lets its next prompt run whole, and a chunk time below any
    forward keeps every chunk at MIN_CHUNK. The output is the whole prefill's."""
    from engine.serving.scheduler import MIN_CHUNK

    long_prompt = "def parse(line):\n    return line.split(),\n" * 6
    settings = {"method": "none", "enable_prefix_caching": False, "max_tokens": 8}
    expected = alone(family(), long_prompt, settings)

    def chunks(scheduler, engine):
        s = GenerationSession(engine, long_prompt, settings)
        events = run_all(scheduler, [s])[s.id]
        assert events[-1].summary["text"] == expected
        done = [0] + [e.num_computed for e in events if e.type == "prefill_progress" and e.model == "target"]
        return [b - a for a, b in zip(done, done[1:])]

    engine = family()
    slow = chunks(Scheduler(chunk_seconds=1e-9), engine)
    assert slow[:-1] == [MIN_CHUNK] * (len(slow) - 1) and len(slow) > 10
    patient = Scheduler(chunk_seconds=10.0)
    first = chunks(patient, engine)
    assert first[0] == MIN_CHUNK and len(first) >= 2 and first[1] > MIN_CHUNK, first
    assert chunks(patient, engine) == []                  # measured: the whole prompt fits one chunk's time
    assert chunks(Scheduler(), engine) == []               # neither budget: every prefill whole
    assert all(m.pool.num_used_blocks == 0 for m in engine.managers.values())
