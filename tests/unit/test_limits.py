"""The admission policy of a listener: pending connections give way, active ones do not."""

from __future__ import annotations

import pytest

from netstack.limits import Admission, ListenerLimits


def test_pending_connections_are_evicted_oldest_first() -> None:
    a: Admission[str] = Admission(max_connections=10, max_pending=3)
    assert [a.admit(c) for c in "abc"] == [(True, [])] * 3
    assert a.admit("d") == (True, ["a"])
    assert a.admit("e") == (True, ["b"])
    a.activate("c")  # finished its handshake: no longer gives way
    assert a.admit("f") == (True, [])
    assert a.admit("g") == (True, ["d"])
    assert a.statistics().pending == 3 and a.statistics().active == 1 and a.evicted == 3


def test_full_of_active_connections_refuses_new_ones() -> None:
    a: Admission[str] = Admission(max_connections=2, max_pending=2)
    for c in "ab":
        assert a.admit(c) == (True, [])
        a.activate(c)
    assert a.admit("c") == (False, [])
    assert a.refused == 1
    a.release("a")
    assert a.admit("d") == (True, [])


def test_at_the_total_limit_a_pending_connection_gives_way_before_refusing() -> None:
    a: Admission[str] = Admission(max_connections=3, max_pending=3)
    for c in "abc":
        a.admit(c)
    a.activate("a")
    a.activate("b")
    assert a.admit("d") == (True, ["c"])
    assert len(a) == 3


def test_idle_keep_alive_connection_becomes_the_youngest_pending() -> None:
    a: Admission[str] = Admission(max_connections=10, max_pending=2)
    a.admit("a")
    a.activate("a")
    a.admit("b")
    a.idle("a")  # served a request; waits for another
    assert a.admit("c") == (True, ["b"])
    assert a.admit("d") == (True, ["a"])


def test_release_of_unknown_or_twice_is_harmless() -> None:
    a: Admission[str] = Admission(max_connections=1, max_pending=1)
    a.release("x")
    a.admit("a")
    a.release("a")
    a.release("a")
    a.activate("a")  # closed before its handshake completed
    assert len(a) == 0


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        ListenerLimits(max_connections=0)
    with pytest.raises(ValueError):
        ListenerLimits(handshake_timeout_s=0)
