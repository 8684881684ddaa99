"""`core/heap.py` `IdleRelease`: the free heap goes back once no request has run for a while,
never while one runs (the server's idle trim and the engine process's)."""

from __future__ import annotations

import threading

from omniflow.core.heap import IdleRelease


def test_the_last_request_to_end_arms_one_release():
    released = threading.Event()
    idle = IdleRelease(released.set, 0.01)
    idle.busy()
    idle.busy()
    idle.idle()
    assert not idle.armed  # one still runs
    idle.idle()
    assert idle.armed
    assert released.wait(10)


def test_a_request_that_starts_cancels_the_waiting_release():
    calls: list[int] = []
    idle = IdleRelease(lambda: calls.append(1), 60.0)  # never reached within the test
    idle.busy()
    idle.idle()
    assert idle.armed
    idle.busy()
    assert not idle.armed and not calls


def test_without_a_release_nothing_is_armed():
    idle = IdleRelease(None, 0.01)
    idle.busy()
    idle.idle()
    assert not idle.armed
