"""TimerIndex (timers derived from an operator's state, one index per timestamp) against TimerQueue (a timer
table with a heap): the same registrations, deletions and chunked firings give the same timers in the same
order (timestamp, then packed key), also when timers are registered while a timestamp is half fired."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution.timers import TimerIndex, TimerQueue

KEYS = st.one_of(st.sampled_from(["a", "b", "ab", "k10", "k9"]), st.integers(-3, 300), st.tuples(st.integers(0, 2)))
OPS = st.lists(st.one_of(st.tuples(st.just("reg"), KEYS, st.integers(0, 20)),
                         st.tuples(st.just("del"), KEYS, st.integers(0, 20)),
                         st.tuples(st.just("pop"), st.integers(0, 20), st.integers(1, 4))), max_size=120)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_index_fires_what_the_queue_fires_in_the_same_order(ops: list[tuple[Any, ...]]) -> None:
    queue = TimerQueue({})
    state: dict[Any, set[int]] = {}  # the "operator state" the index is derived from, kept like the queue's table
    index = TimerIndex({}, lambda legacy: [(k, ts) for k, stamps in state.items() for ts in stamps])
    for op in ops:
        if op[0] == "reg":
            _, key, ts = op
            assert index.register(key, ts) == queue.register(key, ts)
            state.setdefault(key, set()).add(ts)
        elif op[0] == "del":
            _, key, ts = op
            assert index.delete(key, ts) == queue.delete(key, ts)
            state.get(key, set()).discard(ts)
        else:
            _, upto, n = op
            for _ in range(n):  # a chunk of n
                fired = queue.pop_due(upto)
                assert index.pop_due(upto) == fired
                if fired is not None:
                    state[fired[1]].discard(fired[0])
        assert index.peek() == queue.peek()
        assert len(index) == len(queue)
    index.rebuild()  # as after a restore: from the state alone
    rest = []
    while (due := queue.pop_due(10**9)) is not None:
        rest.append(due)
    assert [index.pop_due(10**9) for _ in rest] == rest
    assert index.pop_due(10**9) is None and index.peek() is None


def test_a_timestamp_half_fired_takes_a_new_key_in_its_place() -> None:
    index = TimerIndex({}, lambda legacy: [])
    for key in ("k1", "k3", "k5"):
        index.register(key, 10)
    assert index.pop_due(10) == (10, "k1")
    index.register("k4", 10)  # between two chunks of timestamp 10
    index.register("k0", 10)  # sorts before the cursor's next key: still fires (the queue's heap would, too)
    assert [index.pop_due(10) for _ in range(4)] == [(10, "k0"), (10, "k3"), (10, "k4"), (10, "k5")]
    assert index.pop_due(10) is None
