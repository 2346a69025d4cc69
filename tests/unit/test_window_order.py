"""A key's windows stay in order of their ends, which the window operator's batch loop finds them by (bisection):
`process` opens a late window in its place, and a restore puts an earlier version's windows in order (that version
appended such a window at the end)."""

from __future__ import annotations

from runtime.api import MAX_WATERMARK, TumblingEventTimeWindows
from runtime.api.windows import CountAggregate, WindowOperator, _Aggregated
from tests.support.window_harness import WindowHarness


def counting_windows() -> WindowHarness:
    """Tumbling 10 ms counts with 100 ms of allowed lateness, driven by hand."""
    return WindowHarness(WindowOperator(TumblingEventTimeWindows(10), _Aggregated(CountAggregate()),
                                        allowed_lateness_ms=100))


def ends(h: WindowHarness, key: str) -> list[int]:
    return [e[1] for e in h.chain.keyed_state[h.node_id]["windows"][key]]


def test_a_late_window_that_process_opens_goes_in_its_place() -> None:
    h = counting_windows()
    h.batch([("a", 0, 25), ("a", 1, 35)])
    h.watermark(40)  # both fired, kept for the lateness
    h.batch([("a", 2, 5)])  # [0, 10) was never opened: `process` opens (and fires) it
    assert ends(h, "a") == [10, 30, 40]


def test_a_restore_puts_an_earlier_versions_windows_in_order_and_the_batch_loop_finds_each_one() -> None:
    h = counting_windows()
    # as an earlier version wrote them: the late windows [0, 10) and [10, 20) appended after [30, 40)
    h.chain.restore_state({h.node_id: {"windows": {"a": [[30, 40, 1], [0, 10, 1, True], [10, 20, 1, True]]}}}, None)
    h.chain.restore_watermarks(29, 29)
    h.batch([("a", 3, 33), ("a", 4, 35), ("a", 5, 45)])  # into [30, 40) (in the batch loop), a new [40, 50)
    h.watermark(MAX_WATERMARK)
    records = sorted(record for _, record in h.outputs())  # (stamp, record) pairs
    assert records == [("a", 30, 40, 3), ("a", 40, 50, 1)]  # one [30, 40): found, not doubled
