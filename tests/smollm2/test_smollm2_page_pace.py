"""The page at full speed (app/ws/sender.py): a slow model's rounds go out one a message, a fast model's at most
ten messages a second, and a page that stops acknowledging still gets a message every ACK_TIMEOUT_S.

The sender runs on virtual time (tests/virtual_time.py) with that loop's clock as its pacing clock: SmolLM2's real
rounds, rendered by the page's own view, arrive at the times the test gives, and the page acknowledges each message
one frame after it arrives, as static/playground.js does. What is checked happens at those times on any machine,
however busy (the rendering and the model take no virtual time)."""
import asyncio
import math

import pytest
from test_ws_html import Fragments
from virtual_time import run_on_virtual_time

from app.protocol import Batch, RenderContext
from app.views.html import HtmlView
from app.ws.engine_thread import ROUND_END, SessionLink
from app.ws.run import ClientPace
from app.ws.sender import ACK_TIMEOUT_S, OWN_MESSAGE_S, PacedSender
from app.ws.socket import MIN_INTERVAL_S, Outbox, Socket
from engine.serving.session import GenerationSession

FRAME_S = 1 / 60                # the page acknowledges a message at its next animation frame
SLOW_ROUND_S = 0.030            # rounds farther apart than OWN_MESSAGE_S, as SmolLM2's are
FAST_ROUND_S = 0.010            # a character model's pace or faster: well below OWN_MESSAGE_S
NUM_TOKENS = 64


class Page:
    """The websocket of a page: keeps each message with its (virtual) arrival time and, while `acks`,
    acknowledges it one frame later."""

    def __init__(self, acks: bool):
        self.acks = acks
        self.messages: list[tuple[float, str]] = []
        self.sender: PacedSender | None = None

    async def send_text(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        self.messages.append((loop.time(), text))
        if self.acks:
            loop.call_later(FRAME_S, self.sender.acknowledge, len(self.messages))

    def tokens_per_message(self) -> list[tuple[float, int]]:
        """(arrival, tokens) of every message that shows tokens."""
        return [(t, n) for t, text in self.messages
                if (n := sum("tok" in a.get("class", "").split() for _, a in Fragments(text).all))]


@pytest.fixture(scope="module")
def smollm2_run(smollm2_engine) -> tuple[GenerationSession, list[list], int]:
    """A SmolLM2 run's events, a round per list as the engine thread delivers them, and its number of tokens."""
    engine = smollm2_engine
    session = GenerationSession(engine, "Name three colours.", {"model": "smollm2-135m", "method": "none",
                                                                  "chat": True, "temperature": 0,
                                                                  "max_tokens": NUM_TOKENS})
    rounds, current = [], []
    for event in session.events():
        current.append(event)
        if event.type in ROUND_END:
            rounds.append(current)
            current = []
    assert rounds[-1][-1].type == "done", rounds[-1][-1]
    tokens = sum(e.type == "token" for r in rounds for e in r)
    assert tokens >= NUM_TOKENS // 2, tokens
    return session, rounds, tokens


def full_speed_run(session, rounds: list[list], round_s: float, page_acks: bool) -> tuple[Page, float]:
    """The rounds delivered `round_s` apart to a sender for the page at full speed: the page's messages, and the
    time from the first round to the last."""
    page = Page(page_acks)
    pace = ClientPace(acks=True, speed=None)              # the htmx page's view acknowledges; full speed
    ended = False

    async def scenario():
        nonlocal ended
        loop = asyncio.get_running_loop()
        outbox = Outbox()
        link = SessionLink(session, pace, deliver=None)
        page.sender = sender = PacedSender(Socket(page), HtmlView(), outbox, lambda: RenderContext(1, state="running"),
                                           pace, streaming=lambda: not ended, poke_engine=lambda: None,
                                           clock=loop.time)
        task = asyncio.create_task(sender.run())
        await asyncio.sleep(1.0)
        first = loop.time()
        for events in rounds:
            outbox.put_batch(Batch(1, events, link))
            if events[-1].type == "done":                 # as Connection.deliver does at the end
                ended = True
                sender.wake()
            else:
                await asyncio.sleep(round_s)
        seconds = loop.time() - first
        await asyncio.sleep(2 * ACK_TIMEOUT_S)             # everything taken goes out
        task.cancel()
        assert link.rounds_taken == len(rounds)
        return seconds

    return page, run_on_virtual_time(scenario())


def assert_one_message_every(interval: float, page: Page, seconds: float, tokens: int) -> None:
    """Every token arrived, in one message every `interval`, besides the first and the last: the first goes out
    at once (nothing was held before it), the last at the end of the run (`done` is never held)."""
    arrivals = page.tokens_per_message()
    assert sum(n for _, n in arrivals) == tokens
    assert len(arrivals) <= math.floor(seconds / interval) + 2, (arrivals, seconds)
    middle = [t for t, _ in arrivals[1:-1]]
    gaps = [b - a for a, b in zip(middle, middle[1:])]
    assert len(gaps) >= 2 and all(abs(g - interval) < 1e-6 for g in gaps), gaps


def test_smollm2s_tokens_appear_as_they_are_made_and_a_fast_models_ten_times_a_second(smollm2_run):
    """Rounds farther apart than OWN_MESSAGE_S go out a message each: every message with tokens holds exactly one
    (a round of `method none` makes one). The same rounds FAST_ROUND_S apart are coalesced: one message every
    MIN_INTERVAL_S, besides the first and the last, none lost."""
    assert FAST_ROUND_S < OWN_MESSAGE_S < SLOW_ROUND_S
    session, rounds, tokens = smollm2_run
    slow, _ = full_speed_run(session, rounds, SLOW_ROUND_S, page_acks=True)
    counts = [n for _, n in slow.tokens_per_message()]
    assert counts == [1] * tokens, counts

    fast, seconds = full_speed_run(session, rounds, FAST_ROUND_S, page_acks=True)
    assert_one_message_every(MIN_INTERVAL_S, fast, seconds, tokens)


def test_a_page_that_stops_acknowledging_gets_a_message_every_ack_timeout(smollm2_run):
    """A page that renders nothing more (a background tab) is not waited for beyond ACK_TIMEOUT_S: its rounds
    go out together, one message every ACK_TIMEOUT_S, none lost."""
    session, rounds, tokens = smollm2_run
    page, seconds = full_speed_run(session, rounds, SLOW_ROUND_S, page_acks=False)
    assert_one_message_every(ACK_TIMEOUT_S, page, seconds, tokens)
