"""A window operator's chain driven by hand, as tests/unit/test_window_fast_path.py and test_window_order.py use
it: records in batches, watermarks, the outputs and late records decoded, a snapshot as a checkpoint takes it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import msgpack

from runtime.api import LATE_DATA, BoundedOutOfOrderness, GeneratorSource, Job
from runtime.api.windows import WindowOperator
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.task import Task
from tests.support.buffers import make_subs, sent
from tests.support.chain_time import advance_watermark


class WindowHarness:
    """source -> key_by -> window operator, driven by hand; outputs and late records decoded in order."""

    def __init__(self, operator: WindowOperator) -> None:
        job = Job()
        src = job.source(GeneratorSource(count=1),
                         watermarks=BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2]))
        windowed = src.key_by(lambda r: r[0]).process(operator, name="windows")
        windowed.side_output(LATE_DATA).map(lambda r: r, name="late")
        self.main, self.late = make_subs(1, 1 << 20), make_subs(1, 1 << 20)
        main_w = RecordWriter(self.main, "forward", None, job.max_parallelism, 0)
        late_w = RecordWriter(self.late, "forward", None, job.max_parallelism, 0)
        late_w.side_output = (windowed.node_id, LATE_DATA.name)
        self.chain = Chain(job, [windowed.node_id], subtask_index=0, parallelism=1, attempt=0,
                           outputs=[main_w, late_w])
        self.chain.open()
        self.node_id = windowed.node_id

    def batch(self, records: list[tuple[str, int, int]]) -> None:
        self.chain.process_batch([(r[2], r) for r in records])

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 5)

    def outputs(self) -> list[Any]:
        return [x for x in decode(self.main[0]) if isinstance(x, tuple)]

    def late_records(self) -> list[Any]:
        return [x for x in decode(self.late[0]) if isinstance(x, tuple)]

    def snapshot(self) -> dict[int, dict[str, dict[Any, Any]]]:
        """The keyed state as a checkpoint carries it (serialised and read back)."""
        return read_back(self.begin_snapshot())

    def begin_snapshot(self) -> dict[int, dict[str, dict[Any, Any]]]:
        """A checkpoint's synchronous part as the task takes it: the operators' `before_snapshot`
        (Chain.begin_state_snapshot), then the shallow copy of the tables (Task.snapshot_keyed_state, the real
        method), which the checkpoint encodes later, on its writer thread, while the task goes on."""
        assert self.chain.begin_state_snapshot(1) is None  # the memory path: no backend's snapshot
        return Task.snapshot_keyed_state(cast(Task, SimpleNamespace(chain=self.chain)))


def read_back(copied: dict[int, dict[str, dict[Any, Any]]]) -> dict[int, dict[str, dict[Any, Any]]]:
    """What a restore reads of a snapshot's tables: serialised, then read back."""
    raw = msgpack.unpackb(msgpack.packb(copied), strict_map_key=False, use_list=False)
    return {int(n): {name: dict(t) for name, t in tables.items()} for n, tables in raw.items()}


def decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return list(unpacker)
