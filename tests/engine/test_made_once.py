"""`MadeOnce` (engine/serving/registry.py): what the engine makes on first use (a target's heads, a KV pool) is made
once per key whichever threads ask at the same moment; the others get the one made. SmolLM2's concurrent starts:
tests/smollm2/test_load_once.py."""
from __future__ import annotations

import threading

import pytest

from engine.serving.registry import MadeOnce

WAIT_S = 10.0


def asking(once: MadeOnce, key, make, got: dict):
    return threading.Thread(target=lambda: got.__setitem__(threading.current_thread().name, once.get(key, make)))


def test_who_asks_while_a_value_is_made_gets_that_one_and_makes_none():
    once, got, started, release = MadeOnce(), {}, threading.Event(), threading.Event()
    second_makes = []

    def first_make():
        started.set()
        release.wait(WAIT_S)
        return "first"

    first = asking(once, "pool", first_make, got)
    first.start()
    assert started.wait(WAIT_S)
    second = asking(once, "pool", lambda: second_makes.append(1) or "second", got)
    second.start()
    second.join(0.5)
    assert second.is_alive()                 # waiting for the first maker, not making its own
    release.set()
    for t in (first, second):
        t.join(WAIT_S)
    assert got == {first.name: "first", second.name: "first"} and second_makes == []
    assert once.get("pool", lambda: "third") == "first"


def test_a_value_being_made_holds_up_no_other_key():
    once, got, started, release = MadeOnce(), {}, threading.Event(), threading.Event()
    slow = asking(once, "big", lambda: started.set() or release.wait(WAIT_S) and "big", got)
    slow.start()
    assert started.wait(WAIT_S)
    other = asking(once, "small", lambda: "small", got)
    other.start()
    other.join(WAIT_S)
    assert not other.is_alive() and got[other.name] == "small" and slow.is_alive()
    release.set()
    slow.join(WAIT_S)
    assert got[slow.name] == "big" and once.made == {"big": "big", "small": "small"}


def test_a_make_that_fails_leaves_nothing_and_the_next_asker_makes_again():
    once = MadeOnce()

    def broken():
        raise OSError("heads file unreadable")

    with pytest.raises(OSError, match="unreadable"):
        once.get("heads", broken)
    assert "heads" not in once.made
    assert once.get("heads", lambda: {"eagle": 1}) == {"eagle": 1}
