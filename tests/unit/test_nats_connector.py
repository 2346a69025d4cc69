"""The NATS connector's pure parts (split, message ids, the bounded end, encoding), and the task's side of a source
that prefetches: a restore must skip the records already emitted even when the first reads find none ready."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.api import Job, NatsSink, NatsSource, Sink, Source
from runtime.connectors.nats import (
    assigned_subjects,
    at_end,
    decode_json,
    encode_json,
    message_id,
    partition_subjects,
)
from runtime.execution.channels import OutputGate
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, RestoredState, Task, TaskKey


@given(partitions=st.integers(1, 64), parallelism=st.integers(1, 16))
def test_every_partition_is_read_by_exactly_one_subtask(partitions: int, parallelism: int) -> None:
    seen: list[str | None] = []
    for subtask in range(parallelism):
        mine = assigned_subjects("orders", partitions, subtask, parallelism)
        assert all(int(str(s).rsplit(".", 1)[1]) % parallelism == subtask for s in mine)
        seen += mine
    assert sorted(seen, key=str) == sorted(partition_subjects("orders", partitions), key=str)
    assert len(seen) == partitions


def test_without_partitions_subtask_zero_reads_the_subject_and_the_others_nothing() -> None:
    assert assigned_subjects("orders.>", None, 0, 3) == ["orders.>"]
    assert assigned_subjects(None, None, 0, 3) == [None]  # the whole stream
    assert assigned_subjects("orders.>", None, 1, 3) == []
    assert assigned_subjects("orders.>", None, 2, 3) == []


def test_bad_partitioning_is_refused_when_the_job_is_defined() -> None:
    with pytest.raises(ValueError, match="need a subject"):
        NatsSource("nats://127.0.0.1:4222", "S", partitions=4)
    with pytest.raises(ValueError, match=">= 1"):
        NatsSource("nats://127.0.0.1:4222", "S", subject="s", partitions=0)


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 10**6), st.integers(0, 10**5)), unique=True))
def test_message_ids_are_distinct_per_record_and_stable(records: list[tuple[int, int, int]]) -> None:
    ids = [message_id("sluice-ab12", s, c, i) for s, c, i in records]
    assert len(set(ids)) == len(ids)
    assert ids == [message_id("sluice-ab12", s, c, i) for s, c, i in records]
    assert all(mid.startswith("sluice-ab12-") for mid in ids)


def test_message_ids_of_different_tokens_never_collide() -> None:
    assert message_id("a-1", 0, 1, 2) != message_id("a-2", 0, 1, 2)
    assert message_id("a", 1, 12, 3) != message_id("a", 11, 2, 3)


def test_bounded_end() -> None:
    assert not at_end(5, None, 0)  # unbounded never ends
    assert not at_end(5, 10, 3)
    assert at_end(10, 10, 3)
    assert at_end(5, 10, 0)  # nothing of its subjects follows: everything up to the bound was read


def test_json_round_trip_turns_arrays_into_tuples() -> None:
    assert decode_json(encode_json(("k1", 3))) == ("k1", 3)
    assert decode_json(encode_json({"a": "é"})) == {"a": "é"}


def test_constructing_connectors_does_not_connect() -> None:
    """Jobs are built on the coordinator too, which never reads or writes the streams."""
    job = Job("j")
    job.source(NatsSource("nats://127.0.0.1:1", "IN", subject="in", partitions=2)).sink(NatsSink("nats://127.0.0.1:1",
                                                                                                  "out"))
    assert [n.kind for n in job.nodes] == ["source", "sink"]


# -- the task's side of a prefetching source ------------------------------------------------------------------


class PrefetchingSource(Source):
    """Records 0..n-1, but each read first finds nothing ready, as a source that fills a buffer from a
    broker in the background does."""

    def __init__(self, n: int) -> None:
        self.n = n

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.next = 0
        self.ready = False
        self.closed = False

    def read_batch(self, max_records: int) -> list[Any] | None:
        if self.next >= self.n:
            return None
        if not self.ready:
            self.ready = True
            return []
        self.ready = False
        out = list(range(self.next, min(self.n, self.next + max_records, self.next + 3)))
        self.next += len(out)
        return out

    def idle_wait_s(self) -> float:
        return 0.001

    def position(self) -> Any:
        return self.next

    def restore(self, position: Any) -> None:
        self.next = int(position)

    def close(self) -> None:
        self.closed = True


class ListSink(Sink):
    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        self.records: list[Any] = []

    def write(self, record: Any) -> None:
        self.records.append(record)


def run_task(source: Source, sink: ListSink, restore: RestoredState | None) -> None:
    job = Job("t")
    job.source(source).sink(sink)
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    task = Task(key=TaskKey("job", 0, 0, "t", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=source, flush_timeout_s=0.01, restore=restore)
    asyncio.run(asyncio.wait_for(task.run(), 10))


def test_restore_skips_emitted_records_even_when_none_are_ready_yet() -> None:
    """The checkpoint said: 7 records of the batch starting at 10 were emitted. Before the fix the task stopped
    skipping at the first empty read and emitted 10..16 a second time."""
    source, sink = PrefetchingSource(30), ListSink()
    run_task(source, sink, RestoredState(source=[10, 7]))
    assert sink.records == list(range(17, 30))


def test_the_task_closes_its_source() -> None:
    source, sink = PrefetchingSource(5), ListSink()
    run_task(source, sink, None)
    assert sink.records == list(range(5))
    assert source.closed
