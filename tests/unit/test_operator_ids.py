"""Operator uids: explicit ones, the positional default, validation, and what a checkpoint records of them."""

from __future__ import annotations

import pytest

from runtime.api import Job, JobDefinitionError
from runtime.api.windows import TumblingEventTimeWindows
from runtime.connectors.generator import GeneratorSource
from runtime.connectors.sinks import DiscardSink
from runtime.examples.wordcount import Count
from runtime.graph.operator_ids import UnknownUid, assign_uids, graph_document, node_of_uid
from runtime.graph.plan import apply_parallelism, chain_graph


def counted(job: Job, *, name: str = "Count", extra_map: bool = False, uids: bool = False) -> None:
    src = job.source(GeneratorSource(count=10), parallelism=2)
    if uids:
        src = src.uid("src")
    if extra_map:
        src = src.map(lambda r: r, name="identity")
    counts = src.key_by(lambda r: r[0]).process(Count(), parallelism=2, name=name)
    if uids:
        counts = counts.uid("count")
    counts.sink(DiscardSink())


def uids_of(job: Job) -> list[str]:
    assign_uids(job)
    return [n.uid for n in job.nodes]


def built(**kwargs: bool | str) -> Job:
    job = Job("t")
    counted(job, **kwargs)  # type: ignore[arg-type]
    assign_uids(job)
    return job


def test_explicit_uids_are_kept_on_every_kind_of_operator() -> None:
    job = Job("t")
    (job.source(GeneratorSource(count=1)).uid("in").map(lambda r: r).uid("m").filter(bool).uid("f")
        .key_by(lambda r: r).window(TumblingEventTimeWindows(1000)).count().uid("w").sink(DiscardSink()).uid("out"))
    assert uids_of(job) == ["in", "m", "f", "w", "out"]


def test_default_uids_do_not_depend_on_names_or_parallelism() -> None:
    a, b = built(), built(name="Counter")
    apply_parallelism(b, {"*": 3})
    assert [n.uid for n in a.nodes] == [n.uid for n in b.nodes]
    assert [n.uid.split("-")[0] for n in a.nodes] == ["source", "keyed_process", "sink"]


def test_an_inserted_operator_changes_the_defaults_downstream_but_not_explicit_uids() -> None:
    plain, inserted = built(), built(extra_map=True)
    assert plain.nodes[0].uid == inserted.nodes[0].uid
    assert plain.nodes[1].uid != inserted.nodes[2].uid  # the count's input changed
    anchored, anchored_inserted = built(uids=True), built(uids=True, extra_map=True)
    assert anchored.nodes[1].uid == anchored_inserted.nodes[2].uid == "count"
    assert anchored.nodes[2].uid == anchored_inserted.nodes[3].uid  # the sink's default follows "count"


def test_siblings_of_the_same_kind_get_distinct_defaults() -> None:
    job = Job("t")
    src = job.source(GeneratorSource(count=1))
    src.map(lambda r: r).sink(DiscardSink())
    src.map(lambda r: r).sink(DiscardSink())
    uids = uids_of(job)
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
def test_an_empty_or_non_string_uid_is_refused(bad: object) -> None:
    job = Job("t")
    with pytest.raises(JobDefinitionError, match="non-empty string"):
        job.source(GeneratorSource(count=1)).uid(bad)  # type: ignore[arg-type]


def test_a_duplicate_uid_is_refused_naming_both_operators() -> None:
    job = Job("t")
    src = job.source(GeneratorSource(count=1), name="in").uid("x")
    with pytest.raises(JobDefinitionError, match="'x' of mapper is already the uid of in"):
        src.map(lambda r: r, name="mapper").uid("x")


def test_parallelism_overrides_accept_a_uid() -> None:
    job = built(uids=True)
    apply_parallelism(job, {"count": 3})
    assert [n.parallelism for n in job.nodes] == [2, 3, 2]


def test_the_checkpoint_records_each_operator_and_resolves_uids_to_node_ids() -> None:
    job = built(uids=True, extra_map=True)
    vertices, edges = chain_graph(job)
    doc = graph_document(job, vertices, edges)
    assert [(o["uid"], o["name"], o["kind"], o["node"], o["vertex"]) for o in doc["operators"]] == [
        ("src", "GeneratorSource", "source", 0, 0), (job.nodes[1].uid, "identity", "map", 1, 0),
        ("count", "Count", "keyed_process", 2, 1), (job.nodes[3].uid, "DiscardSink", "sink", 3, 1)]
    assert [(e["up_uid"], e["down_uid"], e["input_index"], e["partitioner"]) for e in doc["edges"]] == [
        (job.nodes[1].uid, "count", 0, "hash")]
    metadata = {"checkpoint_id": 4, **doc}
    assert node_of_uid(metadata, "count") == 2
    with pytest.raises(UnknownUid, match="no operator with uid 'cuont'; did you mean 'count'"):
        node_of_uid(metadata, "cuont")
    with pytest.raises(UnknownUid, match="records no operator uids"):
        node_of_uid({"checkpoint_id": 4}, "count")
