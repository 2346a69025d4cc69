"""A task's idle, backpressured and busy time, with the wait in progress counted when read."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.execution.time_accounting import BACKPRESSURED_TIME, IDLE_TIME, TimeAccounting, Times


def test_an_ongoing_wait_counts_when_read() -> None:
    t = TimeAccounting()
    t.start(100.0)
    t.begin_wait(BACKPRESSURED_TIME, 101.0)
    # a source blocked on a full output for 24 s of 25 reads 24 s backpressured while it still waits
    assert t.read(125.0) == Times(busy_s=1.0, idle_s=0.0, backpressured_s=24.0)
    t.end_wait(125.5)
    t.begin_wait(IDLE_TIME, 126.0)
    assert t.read(127.0) == Times(busy_s=1.5, idle_s=1.0, backpressured_s=24.5)
    t.finish(128.0)
    assert t.read(500.0) == Times(busy_s=1.5, idle_s=2.0, backpressured_s=24.5)  # frozen at the finish


def test_reads_between_heartbeats_give_every_interval_its_own_share() -> None:
    # one wait spanning three heartbeats: each interval sees its part (before, 0 then the whole wait at its end)
    t = TimeAccounting()
    t.start(0.0)
    t.begin_wait(BACKPRESSURED_TIME, 0.5)
    readings = [t.read(now).backpressured_s for now in (1.0, 2.0, 3.0)]
    assert [b - a for a, b in zip([0.0, *readings], readings, strict=False)] == [0.5, 1.0, 1.0]


def test_not_started_reads_zero() -> None:
    assert TimeAccounting().read(10.0) == Times(0.0, 0.0, 0.0)


@given(st.lists(st.tuples(st.sampled_from([IDLE_TIME, BACKPRESSURED_TIME, None]), st.floats(0.0, 5.0)), max_size=30),
       st.floats(0.0, 5.0))
def test_the_parts_add_up_to_wall_time_and_never_decrease(steps: list[tuple[str | None, float]],
                                                          read_after: float) -> None:
    t = TimeAccounting()
    now = 0.0
    t.start(now)
    last = Times(0.0, 0.0, 0.0)
    for kind, dt in steps:
        if kind is None:
            t.end_wait(now)
        else:
            t.begin_wait(kind, now)
        now += dt
        got = t.read(now)
        assert abs(got.busy_s + got.idle_s + got.backpressured_s - now) < 1e-6
        assert got.idle_s >= last.idle_s - 1e-9 and got.backpressured_s >= last.backpressured_s - 1e-9
        last = got
    got = t.read(now + read_after)
    assert abs(got.busy_s + got.idle_s + got.backpressured_s - (now + read_after)) < 1e-6
