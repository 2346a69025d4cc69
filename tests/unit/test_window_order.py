"""A key's windows stay in order of their ends, which the window operator's batch loop finds them by (bisection):
`process` opens a late window in its place, and a restore puts an earlier version's windows in order (that version
appended such a window at the end)."""

from __future__ import annotations

from typing import Any

from runtime.api import MAX_WATERMARK, BoundedOutOfOrderness, GeneratorSource, Job, TumblingEventTimeWindows
from runtime.api.windows import CountAggregate, WindowOperator, _Aggregated
from runtime.execution.operators import Chain
from tests.support.buffers import ListSink
from tests.support.chain_time import advance_watermark


class CountingWindows:
    """source -> key_by -> tumbling 10 ms counts with 100 ms of allowed lateness -> a ListSink, driven by hand."""

    def __init__(self) -> None:
        job = Job()
        src = job.source(GeneratorSource(count=1),
                         watermarks=BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2]))
        operator = WindowOperator(TumblingEventTimeWindows(10), _Aggregated(CountAggregate()), allowed_lateness_ms=100)
        windowed = src.key_by(lambda r: r[0]).process(operator, name="windows")
        sink = windowed.sink(ListSink(), name="out")
        self.chain = Chain(job, [windowed.node_id, sink.node_id], subtask_index=0, parallelism=1, attempt=0,
                           outputs=[])
        self.chain.open()
        self.node_id = windowed.node_id

    def batch(self, records: list[tuple[str, int, int]]) -> None:
        self.chain.process_batch([(r[2], r) for r in records])

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 5)

    def outputs(self) -> list[Any]:
        return list(self.chain.sinks[0].out)  # type: ignore[attr-defined]

    def ends(self, key: str) -> list[int]:
        return [e[1] for e in self.chain.keyed_state[self.node_id]["windows"][key]]


def test_a_late_window_that_process_opens_goes_in_its_place() -> None:
    h = CountingWindows()
    h.batch([("a", 0, 25), ("a", 1, 35)])
    h.watermark(40)  # both fired, kept for the lateness
    h.batch([("a", 2, 5)])  # [0, 10) was never opened: `process` opens (and fires) it
    assert h.ends("a") == [10, 30, 40]


def test_a_restore_puts_an_earlier_versions_windows_in_order_and_the_batch_loop_finds_each_one() -> None:
    h = CountingWindows()
    # as an earlier version wrote them: the late windows [0, 10) and [10, 20) appended after [30, 40)
    h.chain.restore_state({h.node_id: {"windows": {"a": [[30, 40, 1], [0, 10, 1, True], [10, 20, 1, True]]}}}, None)
    h.chain.restore_watermarks(29, 29)
    h.batch([("a", 3, 33), ("a", 4, 35), ("a", 5, 45)])  # into [30, 40) (in the batch loop), a new [40, 50)
    h.watermark(MAX_WATERMARK)
    assert sorted(h.outputs()) == [("a", 30, 40, 3), ("a", 40, 50, 1)]  # one [30, 40): found, not doubled
