"""The event-time rules `sluice data verify` reproduces (runtime/data/event_time.py), without Spark.

Hand-computed cases pin the rules down; a property test checks that the
closed form verify computes with Spark SQL (written out here in Python, one
line per Spark expression) equals the record-by-record simulation.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.data.event_time import (
    Record,
    Row,
    behind_watermark,
    dropped,
    session_count,
    watermark_after,
    window_count,
    window_starts,
)


def test_window_assignment_is_aligned_at_epoch_zero() -> None:
    assert window_starts(7, 10) == [0]
    assert window_starts(10, 10) == [10]
    assert window_starts(-3, 10) == [-10]
    assert window_starts(7, 10, 5) == [0, 5]
    assert window_starts(10, 10, 5) == [5, 10]
    assert window_starts(-3, 10, 5) == [-10, -5]
    assert window_starts(9, 10, 4) == [0, 4, 8]  # a slide that does not divide the size
    assert window_starts(1_700_000_001_234, 1000) == [1_700_000_001_000]
    with pytest.raises(ValueError):
        window_starts(1, 10, 11)


def test_watermark_and_lateness_rule() -> None:
    assert watermark_after(None, 5) is None
    assert watermark_after(100, 5) == 94
    assert not dropped(10, None, 0)  # before the first watermark nothing is late
    assert dropped(10, 9, 0) and not dropped(10, 8, 0)  # window [0, 10) is done once the watermark is 9
    assert not dropped(10, 9, 1) and dropped(10, 10, 1)


RECORDS: list[Record] = [("a", 0, 3), ("a", 1, 12), ("a", 2, 5), ("b", 3, 11)]


def test_tumbling_without_lateness_drops_the_late_record() -> None:
    # a@3 opens [0,10); a@12 moves the watermark to 11, [0,10) fires with 1; a@5 is then behind it: late.
    rows, late = window_count(RECORDS, size=10)
    assert Counter(rows) == Counter([("a", 0, 10, 1), ("a", 10, 20, 1), ("b", 10, 20, 1)])
    assert late == [("a", 2, 5)]
    # A larger max delay keeps the watermark back (12 - 3 - 1 = 8 < 9): nothing is late.
    rows, late = window_count(RECORDS, size=10, max_delay_ms=3)
    assert Counter(rows) == Counter([("a", 0, 10, 2), ("a", 10, 20, 1), ("b", 10, 20, 1)]) and late == []


def test_allowed_lateness_fires_again_per_late_record() -> None:
    records = RECORDS + [("a", 4, 0), ("c", 5, 1)]
    rows, late = window_count(records, size=10, allowed_lateness_ms=5)
    assert late == []
    # [0,10) of a: first firing with 1, then 2 and 3 for the two records within the lateness; c's window is first
    # seen after its time and fires at once.
    assert Counter(rows) == Counter([("a", 0, 10, 1), ("a", 0, 10, 2), ("a", 0, 10, 3), ("c", 0, 10, 1),
                                     ("a", 10, 20, 1), ("b", 10, 20, 1)])


def test_sliding_record_dropped_from_some_windows_is_not_late() -> None:
    records: list[Record] = [("a", 0, 20), ("a", 1, 14), ("a", 2, 16)]
    rows, late = window_count(records, size=10, slide=5)
    # a@14: both its windows [5,15) and [10,20) are done (watermark 19): late. a@16: [10,20) is done but
    # [15,25) is not, so it counts there.
    assert late == [("a", 1, 14)]
    assert Counter(rows) == Counter([("a", 15, 25, 2), ("a", 20, 30, 1)])


def test_sessions() -> None:
    records: list[Record] = [("a", 0, 0), ("a", 1, 3), ("b", 2, 10), ("a", 3, 10), ("a", 4, 15)]
    # a: 0 and 3 merge into [0, 8); 10 and 15 are exactly a gap apart: [10, 15) and [15, 20) do not overlap.
    assert Counter(session_count(records, gap=5)) == Counter(
        [("a", 0, 8, 2), ("b", 10, 15, 1), ("a", 10, 15, 1), ("a", 15, 20, 1)])
    # A record bridging two open sessions merges all three.
    assert session_count([("a", 0, 0), ("a", 1, 8), ("a", 2, 4)], gap=5, max_delay_ms=10) == [("a", 0, 13, 3)]
    behind = records + [("a", 5, 9)]
    assert behind_watermark(behind, 0) == [("a", 5, 9)]
    with pytest.raises(ValueError, match="seq 5 .* behind the watermark 14"):
        session_count(behind, gap=5)


def closed_form(records: list[Record], *, size: int, slide: int | None, max_delay_ms: int,
                lateness: int) -> tuple[Counter[Row], Counter[Record]]:
    """verify.window_count_expected, one Python line per Spark expression."""
    step = slide or size
    per_window: dict[tuple[str, int], list[int]] = {}
    late: Counter[Record] = Counter()
    max_ts = None
    for key, seq, ts in records:
        wm = None if max_ts is None else max_ts - max_delay_ms - 1
        last_start = ts - ts % step
        first_start = (ts - size) - (ts - size) % step + step
        for start in range(first_start, last_start + 1, step):
            end = start + size
            kept = wm is None or end - 1 + lateness > wm
            on_time = wm is None or wm < end - 1
            n = per_window.setdefault((key, start), [0, 0])
            n[0] += kept and on_time
            n[1] += kept and not on_time
        if wm is not None and last_start + size - 1 + lateness <= wm:
            late[(key, seq, ts)] += 1
        max_ts = ts if max_ts is None else max(max_ts, ts)
    rows: Counter[Row] = Counter()
    for (key, start), (n0, n1) in per_window.items():
        for count in range(max(n0, 1), n0 + n1 + 1):
            rows[(key, start, start + size, count)] += 1
    return rows, late


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60)), max_size=40),
       size=st.integers(1, 12), slide_div=st.integers(1, 4), max_delay=st.integers(0, 8),
       lateness=st.integers(0, 8))
def test_closed_form_equals_simulation(events: list[tuple[str, int]], size: int, slide_div: int, max_delay: int,
                                       lateness: int) -> None:
    slide = max(1, size // slide_div) if slide_div > 1 else None
    records = [(k, seq, ts) for seq, (k, ts) in enumerate(events)]
    rows, late = window_count(records, size=size, slide=slide, max_delay_ms=max_delay,
                              allowed_lateness_ms=lateness)
    expected_rows, expected_late = closed_form(records, size=size, slide=slide, max_delay_ms=max_delay,
                                               lateness=lateness)
    assert Counter(rows) == expected_rows
    assert Counter(late) == expected_late


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 3)), max_size=40),
       gap=st.integers(1, 10), max_delay=st.integers(3, 6))
def test_sessions_equal_the_batch_answer_when_nothing_is_behind(events: list[tuple[str, int]], gap: int,
                                                                 max_delay: int) -> None:
    # Event times run forward with a jitter of at most 3 <= max delay: no record is behind the watermark.
    records = [(k, seq, seq * 2 - d) for seq, (k, d) in enumerate(events)]
    assert behind_watermark(records, max_delay) == []
    batch: Counter[Row] = Counter()
    for key in {k for k, _, _ in records}:
        times = sorted(ts for k, _, ts in records if k == key)
        session = [times[0]]
        for ts in times[1:]:
            if ts - session[-1] >= gap:
                batch[(key, session[0], session[-1] + gap, len(session))] += 1
                session = []
            session.append(ts)
        batch[(key, session[0], session[-1] + gap, len(session))] += 1
    assert Counter(session_count(records, gap=gap, max_delay_ms=max_delay)) == batch
