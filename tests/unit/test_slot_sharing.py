"""Slot sharing groups (`DataStream.slot_sharing_group`): inherited as Flink does, never chained across, and
placed in slots of their own so another group's subtasks run in another worker process."""

from __future__ import annotations

import pytest

from runtime.api import DiscardSink, GeneratorSource, Job, JobDefinitionError
from runtime.graph.plan import chain_graph, place_subtasks, slots_needed


def _job(group_join: bool, parallelism: int = 1) -> Job:
    job = Job("j")
    left = job.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=parallelism, name="left")
    right = job.source(GeneratorSource(count=10, keys=3, seed=2), parallelism=parallelism, name="right")
    joined = left.union(right).key_by(lambda r: r[0]).reduce(lambda a, b: a, name="count")
    if group_join:
        joined.slot_sharing_group("join")
    joined.map(lambda r: r, name="format").sink(DiscardSink(), name="sink")
    return job


def test_operators_inherit_their_inputs_group_and_a_chain_never_spans_two() -> None:
    job = _job(True)
    groups = {n.name: n.slot_sharing_group for n in job.nodes}
    assert groups == {"left": "default", "right": "default", "count": "join", "format": "join", "sink": "join"}
    vertices, _ = chain_graph(job)
    assert [(v.name, v.slot_sharing_group) for v in vertices] == [
        ("left", "default"), ("right", "default"), ("count -> format -> sink", "join")]
    # a group named on an operator that would chain splits the chain there; the operators after it follow
    job = Job("j")
    job.source(GeneratorSource(count=10, keys=3, seed=1), name="src").map(lambda r: r, name="parse") \
        .slot_sharing_group("parse").map(lambda r: r, name="format").sink(DiscardSink(), name="sink")
    assert [(v.name, v.slot_sharing_group) for v in chain_graph(job)[0]] == [
        ("src", "default"), ("parse -> format -> sink", "parse")]


def test_each_group_takes_slots_of_its_own_on_other_workers() -> None:
    vertices, _ = chain_graph(_job(False, parallelism=2))
    assert slots_needed(vertices) == 2
    placement = place_subtasks(vertices, [("w1", 2), ("w2", 2)])
    assert placement == {"0:0": "w1", "0:1": "w2", "1:0": "w1", "1:1": "w2", "2:0": "w1", "2:1": "w2"}

    vertices, _ = chain_graph(_job(True, parallelism=1))
    assert slots_needed(vertices) == 2
    assert place_subtasks(vertices, [("w1", 2), ("w2", 2)]) == {"0:0": "w1", "1:0": "w1", "2:0": "w2"}
    with pytest.raises(JobDefinitionError, match="job needs 2 slots, the cluster has 1 free"):
        place_subtasks(vertices, [("w1", 1)])


def test_a_group_name_must_be_a_non_empty_string() -> None:
    job = Job("j")
    stream = job.source(GeneratorSource(count=10, keys=3, seed=1))
    for bad in ("", "  ", None, 3):
        with pytest.raises(JobDefinitionError, match="slot_sharing_group must be a non-empty string"):
            stream.slot_sharing_group(bad)  # type: ignore[arg-type]
