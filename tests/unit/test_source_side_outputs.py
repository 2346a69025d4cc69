"""A source's side output (runtime/connectors/source.py SideOutputBatch): the records a source sets aside (a
KafkaSource's malformed ones) leave on the edges consuming `source.side_output(tag)`, never through the chain,
with their timestamp in a job with event time; a tag nobody consumes (or None) is dropped."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from runtime.api import BoundedOutOfOrderness, GeneratorSource, Job, JobDefinitionError, OutputTag
from runtime.connectors.source import SideOutputBatch
from runtime.execution.operators import Chain, RecordWriter
from runtime.graph.plan import chain_graph
from tests.support.buffers import make_subs, sent

BAD = OutputTag("bad")


def decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return [x for x in unpacker if not isinstance(x, dict)]  # records, not markers


@pytest.mark.parametrize("event_time", [False, True])
def test_set_aside_records_go_to_the_side_output_edge_only(event_time: bool) -> None:
    job = Job()
    watermarks = BoundedOutOfOrderness(0, timestamp=lambda r: r[1]) if event_time else None
    src = job.source(GeneratorSource(count=1), watermarks=watermarks)
    doubled = src.map(lambda r: (r[0], r[1] * 2), name="doubled")
    src.side_output(BAD).map(lambda r: r, name="bad")
    vertices, edges = chain_graph(job)
    assert [v.name for v in vertices] == ["GeneratorSource -> doubled", "bad"]
    assert [(e.tag, e.tag_node) for e in edges] == [("bad", src.node_id)]
    main, side = make_subs(1, 1 << 20), make_subs(1, 1 << 20)
    main_w = RecordWriter(main, "forward", None, job.max_parallelism, 0)
    side_w = RecordWriter(side, "forward", None, job.max_parallelism, 0)
    side_w.side_output = (src.node_id, BAD.name)
    chain = Chain(job, [src.node_id, doubled.node_id], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[main_w, side_w])
    chain.open()
    element = (lambda ts, r: (ts, r)) if event_time else (lambda ts, r: r)
    chain.process_batch([element(5, ("a", 5))])
    chain.emit_source_side_output(SideOutputBatch("bad", [("offset", 7)], timestamp_ms=9))
    chain.emit_source_side_output(SideOutputBatch("nobody", [("offset", 8)]))  # no consumer: dropped
    chain.emit_source_side_output(SideOutputBatch(None, [None]))  # dropped by the source's choice
    for w in (main_w, side_w):
        w.flush()
    assert decode(main[0]) == [element(5, ("a", 10))]
    assert decode(side[0]) == [element(9, ("offset", 7))]
    assert chain.records_out == 2


def test_only_sources_and_process_functions_have_side_outputs() -> None:
    job = Job()
    with pytest.raises(JobDefinitionError, match="no side outputs"):
        job.source(GeneratorSource(count=1)).map(lambda r: r).side_output(BAD)
