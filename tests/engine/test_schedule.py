"""`num_speculative_tokens_schedule` (engine/spec_decode/schedule.py): the `acceptance` schedule as a function of
the acceptances it observes (no clock anywhere), and in a session: greedy text unchanged, γ as it reports."""
import pytest

from engine.serving.session import GenerationSession
from engine.spec_decode.schedule import (EMA_ALPHA, OFF_BELOW, OFF_ROUNDS, UPDATE_INTERVAL, WARMUP_ROUNDS,
                                         AcceptanceSchedule, make_schedule)


def feed(schedule, rounds):
    """Observe (drafted, accepted) rounds; the γ after each."""
    out = []
    for drafted, accepted in rounds:
        schedule.observe(min(drafted, schedule.k), min(accepted, schedule.k))
        out.append(schedule.k)
    return out


def test_tiers_are_sglang_s_below_the_setting_with_a_zero_tier():
    assert AcceptanceSchedule(16).tiers == (0, 1, 3, 7, 16)
    assert AcceptanceSchedule(5).tiers == (0, 1, 3, 5)
    assert AcceptanceSchedule(3).tiers == (0, 1, 3)
    assert AcceptanceSchedule(1).tiers == (0, 1)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        AcceptanceSchedule(17)
    with pytest.raises(ValueError, match="num_speculative_tokens_schedule"):
        make_schedule("adaptive", 4)


def test_gamma_holds_through_the_warmup_then_moves_every_update_interval():
    s = AcceptanceSchedule(16)
    ks = feed(s, [(16, 3)] * (WARMUP_ROUNDS + 2 * UPDATE_INTERVAL))
    # 3 accepted a round, every round: the average is 3. Past the warmup, 16 drops to 7 (3 <= 7 - 0.5 - 0.25) but
    # not to 3 (3 > 3 - 0.5 - 0.25); at 7 it neither drops nor climbs (3 <= 7 - 0.5)
    assert ks[:WARMUP_ROUNDS - 1] == [16] * (WARMUP_ROUNDS - 1)
    assert ks[WARMUP_ROUNDS - 1:] == [7] * (2 * UPDATE_INTERVAL + 1)
    assert s.mean_accepted == pytest.approx(3.0) and s.report()["why"] == "steady"


def test_the_average_is_an_ema_started_at_the_first_drafting_round():
    s = AcceptanceSchedule(16)
    feed(s, [(16, 10), (16, 0), (16, 5)])
    expected = 10.0
    for a in (0, 5):
        expected = (1 - EMA_ALPHA) * expected + EMA_ALPHA * a
    assert s.mean_accepted == pytest.approx(expected)


def test_rounds_that_drafted_nothing_are_not_counted():
    s = AcceptanceSchedule(16)
    ks = feed(s, [(0, 0)] * 50)
    assert ks == [16] * 50 and s.mean_accepted is None and s.report()["why"] == "warmup"


def test_no_acceptance_turns_speculation_off_and_it_is_probed_again_after_off_rounds():
    s = AcceptanceSchedule(16)
    ks = feed(s, [(16, 0)] * WARMUP_ROUNDS)
    assert ks[-1] == 0                            # every tier's threshold passed at once
    r = s.report()
    assert r["why"] == "off" and r["rounds_to_probe"] == OFF_ROUNDS and r["off_below"] == OFF_BELOW
    ks = feed(s, [(0, 0)] * OFF_ROUNDS)           # plain decode steps
    assert ks == [0] * (OFF_ROUNDS - 1) + [1]     # the lowest positive tier probed
    assert s.report()["why"] == "probe" and s.report()["rounds_to_probe"] is None
    ks = feed(s, [(1, 0)] * UPDATE_INTERVAL)      # the probe fails: off again
    assert ks == [1] * (UPDATE_INTERVAL - 1) + [0]
    ks = feed(s, [(0, 0)] * OFF_ROUNDS + [(1, 1)] * UPDATE_INTERVAL)
    # a probe that accepts its one draft every round: the average climbs past 0.5, so γ climbs to 3 (not to 7:
    # the average stays below 2.5)
    assert ks[-1] == 3 and s.report()["why"] == "up"
    assert 0.5 < s.mean_accepted < 2.5


@pytest.mark.parametrize("accepted, gamma", [(OFF_BELOW, 0), (OFF_BELOW + 0.01, 1)])
def test_the_zero_tier_s_threshold_is_inclusive(accepted, gamma):
    s = AcceptanceSchedule(1)
    s.mean_accepted = accepted                    # a forced state: the average at the threshold
    s._decide()
    assert s.k == gamma


def test_full_acceptance_climbs_back_to_the_setting():
    s = AcceptanceSchedule(16)
    feed(s, [(16, 0)] * WARMUP_ROUNDS + [(0, 0)] * OFF_ROUNDS)
    assert s.k == 1
    ks = feed(s, [(16, 16)] * (8 * UPDATE_INTERVAL))     # each tier accepts all it drafts
    assert ks[-1] == 16 and set(ks) <= {1, 3, 7, 16} and ks == sorted(ks)


PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"


def run(engine, **settings):
    s = GenerationSession(engine, PROMPT, settings)
    events = list(s.events())
    assert events[-1].type == "done", events[-1]
    return events, events[-1].summary


def test_a_suffix_first_asking_at_greedy_gives_plain_text_with_gamma_as_the_schedule_reports(family):
    """A first asking (nothing cached) with the `acceptance` schedule: plain decoding's text, each round's draft
    within the γ the previous metrics reported (none at γ 0), and those γs are what the schedule gives when fed
    the session's own rounds."""
    engine = family()
    _, plain = run(engine, method="none", max_tokens=120)
    events, first = run(engine, method="suffix", num_speculative_tokens=16, max_tokens=120,
                        num_speculative_tokens_schedule="acceptance")
    assert first["text"] == plain["text"]
    replay, gamma, gammas = AcceptanceSchedule(16), 16, []
    for e in events:
        if e.type == "round":
            assert e.num_draft_tokens <= gamma
            replay.observe(e.num_draft_tokens, e.num_accepted)
        elif e.type == "metrics":
            gamma = e.values["num_speculative_tokens"]
            assert gamma == replay.k and e.values["schedule_state"] == replay.report()
            gammas.append(gamma)
    assert first["num_drafts"] > 0 and 0 in gammas and 1 in gammas[gammas.index(0):]   # off, then probed
