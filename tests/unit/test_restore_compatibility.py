"""Whether a checkpoint fits a plan (runtime/graph/restore_compatibility.py): the RestoreSpec it answers with,
and each refusal, from `_metadata` documents and job graphs built here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from coordinator.scheduler import WorkerSlots, make_plan
from runtime.api import Job
from runtime.connectors.generator import GeneratorSource
from runtime.connectors.sinks import DiscardSink
from runtime.connectors.source import Source
from runtime.examples.wordcount import Count
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.graph.job_config import JobConfig
from runtime.graph.operator_ids import assign_uids, graph_document
from runtime.graph.plan import Plan, apply_parallelism, chain_graph
from runtime.graph.restore_compatibility import IncompatibleCheckpoint, restore_spec
from runtime.graph.restore_spec import TaskFiles

PATH, DIRECTORY = "/c/chk-7/_metadata", "/c/chk-7"


class Fixed(Source):
    """A source whose position cannot be split: restored only at its checkpointed parallelism."""


def counting(job: Job, source: Source | None = None) -> None:
    (job.source(source or GeneratorSource(count=10), parallelism=2).uid("src").key_by(lambda r: r[0])
        .process(Count(), name="Count").uid("count").sink(DiscardSink()).uid("out"))


def audited(job: Job) -> None:  # counting with a second keyed operator
    src = job.source(GeneratorSource(count=10), parallelism=2).uid("src")
    src.key_by(lambda r: r[0]).process(Count(), name="Audit").uid("audit").sink(DiscardSink()).uid("audit-out")
    src.key_by(lambda r: r[0]).process(Count(), name="Count").uid("count").sink(DiscardSink()).uid("out")


def built(build: Callable[[Job], Any], parallelism: dict[str, int] | None = None) -> Job:
    job = Job("t")
    build(job)
    assign_uids(job)
    if parallelism:
        apply_parallelism(job, parallelism)
    return job


def plan_of(job: Job, *, allow_non_restored_state: bool = False) -> Plan:
    config = JobConfig(allow_non_restored_state=allow_non_restored_state)
    return make_plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", config=config, job=job,
                     workers=[WorkerSlots("w", 64, "127.0.0.1", 1)], channel_base=1)


def metadata_of(job: Job, *, uids: bool = True) -> CheckpointMetadata:
    """The `_metadata` of a checkpoint of `job`: every task acknowledged with a state file."""
    vertices, edges = chain_graph(job)
    graph = graph_document(job, vertices, edges)
    acks = {f"{v.id}:{i}": {"state": {"state": f"op-{v.id}-{i}"}} for v in vertices for i in range(v.parallelism)}
    doc: dict[str, Any] = {"checkpoint_id": 7, "acks": acks,
                           "vertices": [{"id": v.id, "name": v.name, "parallelism": v.parallelism} for v in vertices]}
    if uids:
        doc.update(operators=graph["operators"], vertices=graph["vertices"], edges=graph["edges"])
    return CheckpointMetadata.from_document(doc)


def test_the_same_job_restores_with_every_task_s_files_and_the_old_parallelisms() -> None:
    job = built(counting)
    spec = restore_spec(metadata_of(job), job, plan_of(job), path=PATH, directory=DIRECTORY)
    assert spec.path == DIRECTORY and spec.checkpoint_id == 7
    assert spec.tasks["0:1"] == TaskFiles(state="op-0-1") and len(spec.tasks) == sum(
        v.parallelism for v in plan_of(job).vertices)
    assert dict(spec.parallelism) == {v.id: v.parallelism for v in plan_of(job).vertices}
    assert dict(spec.nodes) == {n.id: n.parallelism for n in job.nodes}
    assert set(spec.graph) == {"operators", "vertices", "edges"}


def test_a_removed_stateful_operator_is_refused_naming_the_checkpoint_unless_allowed() -> None:
    old, new = built(audited), built(counting)
    with pytest.raises(IncompatibleCheckpoint) as info:
        restore_spec(metadata_of(old), new, plan_of(new), path=PATH, directory=DIRECTORY)
    assert str(info.value).startswith(f"checkpoint {PATH} ") and "Audit (uid 'audit'" in str(info.value)
    assert "--allow-non-restored-state" in str(info.value)
    spec = restore_spec(metadata_of(old), new, plan_of(new, allow_non_restored_state=True), path=PATH,
                        directory=DIRECTORY)
    assert spec.checkpoint_id == 7


def test_a_source_that_cannot_split_its_position_is_refused_at_another_parallelism() -> None:
    old = built(lambda job: counting(job, Fixed()))
    new = built(lambda job: counting(job, Fixed()), {"*": 3})
    with pytest.raises(IncompatibleCheckpoint) as info:
        restore_spec(metadata_of(old), new, plan_of(new), path=PATH, directory=DIRECTORY)
    assert str(info.value).startswith(f"checkpoint {PATH}: source ") and "Fixed" in str(info.value)
    assert "cannot be restored at parallelism 3 (checkpointed at 2)" in str(info.value)


def test_a_rescalable_source_restores_at_another_parallelism_with_the_old_ones_by_node() -> None:
    old, new = built(counting), built(counting, {"*": 3})
    spec = restore_spec(metadata_of(old), new, plan_of(new), path=PATH, directory=DIRECTORY)
    assert dict(spec.nodes) == {n.id: 2 for n in new.nodes if n.parallelism == 3} | {
        n.id: n.parallelism for n in new.nodes if n.parallelism != 3}


def test_a_checkpoint_without_uids_of_another_graph_is_refused() -> None:
    old, new = built(audited), built(counting)
    with pytest.raises(IncompatibleCheckpoint) as info:
        restore_spec(metadata_of(old, uids=False), new, plan_of(new), path=PATH, directory=DIRECTORY)
    assert str(info.value).startswith(f"checkpoint {PATH} was taken from a different job graph: ")


def test_a_checkpoint_without_uids_matches_by_name_and_checks_the_rescale() -> None:
    job = built(counting)
    same = restore_spec(metadata_of(job, uids=False), job, plan_of(job), path=PATH, directory=DIRECTORY)
    assert dict(same.nodes) == {} and dict(same.graph) == {}  # nothing to match: the tasks are the same
    old, new = built(lambda j: counting(j, Fixed())), built(lambda j: counting(j, Fixed()), {"*": 3})
    with pytest.raises(IncompatibleCheckpoint, match=r"^checkpoint /c/chk-7/_metadata: source "):
        restore_spec(metadata_of(old, uids=False), new, plan_of(new), path=PATH, directory=DIRECTORY)


def test_metadata_round_trips_with_the_keys_it_does_not_know() -> None:
    doc = {"checkpoint_id": 3, "acks": {"0:0": {"state": {"state": "f"}, "figures": {}}}, "job_id": "j",
           "attempt": 2, "savepoint": True, "mode": "aligned", "created_at": 1.5, "duration_s": 0.25, "entry": "m:f",
           "name": "t", "vertices": [{"id": 0}], "operators": [], "edges": [], "bootstrapped": {"uid": "u"},
           "format": 2, "checksum": "x"}
    metadata = CheckpointMetadata.from_document(doc)
    assert metadata.extra == {"bootstrapped": {"uid": "u"}} and metadata.task_files() == {"0:0": TaskFiles("f")}
    assert metadata.to_document() == {k: v for k, v in doc.items() if k not in ("format", "checksum")}


@pytest.mark.parametrize(("doc", "reason"), [
    ({"acks": {}}, "'checkpoint_id' must be an integer, got None"),
    ({"checkpoint_id": "7", "acks": {}}, "'checkpoint_id' must be an integer, got '7'"),
    ({"checkpoint_id": 7, "acks": {"0:0": 1}}, "'acks' must be an object of task -> object"),
    ({"checkpoint_id": 7, "acks": {}, "operators": {"uid": "x"}}, "'operators' must be a list of objects"),
])
def test_metadata_a_reader_cannot_use_is_refused_naming_the_field(doc: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError) as info:
        CheckpointMetadata.from_document(doc)
    assert str(info.value) == reason
