"""Restoring into another version of the job: operators matched by uid, what is refused and why, the checkpoint's
task boundaries kept by the chaining, and the restore plan's renaming of state to the new node ids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import Job
from runtime.checkpointing.restore_plan import assemble, plan_restore
from runtime.checkpointing.snapshots import decode_operator_state, encode_operator_state
from runtime.connectors.generator import GeneratorSource
from runtime.connectors.sinks import DiscardSink
from runtime.examples.wordcount import Count
from runtime.graph.evolution import evolution_refusal, inflight_edges, match_operators
from runtime.graph.job_config import JobConfig
from runtime.graph.operator_ids import assign_uids, graph_document
from runtime.graph.plan import Plan, apply_parallelism, chain_graph
from runtime.graph.restore_spec import RestoreSpec, TaskFiles
from runtime.state.memory import MemoryBackend
from runtime.worker.state_backends import renumber


def job_of(build: Callable[[Job], Any], parallelism: dict[str, int] | None = None) -> Job:
    job = Job("t")
    build(job)
    assign_uids(job)
    if parallelism:
        apply_parallelism(job, parallelism)
    return job


def v1(job: Job) -> None:
    src = job.source(GeneratorSource(count=10), parallelism=2).uid("src")
    src.key_by(lambda r: r[0]).process(Count(), name="Audit").uid("audit").sink(DiscardSink()).uid("audit-out")
    src.key_by(lambda r: r[0]).process(Count(), name="Count").uid("count").sink(DiscardSink()).uid("out")


def v2(job: Job) -> None:  # Audit removed, Count renamed, a map added in front of it
    (job.source(GeneratorSource(count=10), parallelism=2).uid("src").map(lambda r: r, name="normalize")
        .key_by(lambda r: r[0]).process(Count(), name="Counter").uid("count").sink(DiscardSink()).uid("out"))


def graph_of(job: Job) -> dict[str, Any]:
    vertices, edges = chain_graph(job)
    return graph_document(job, vertices, edges)


def refusal(old: Job, new: Job, *, allow: bool = False, inflight: set[int] | None = None) -> str | None:
    return evolution_refusal(graph_of(old), new, allow_non_restored_state=allow, inflight_edges=inflight or set(),
                             new_edges=graph_of(new)["edges"])


def test_operators_match_by_uid_whatever_their_names_and_node_ids() -> None:
    match = match_operators(graph_of(job_of(v1)), job_of(v2))
    assert match.old_of_new == {0: 0, 2: 3, 3: 4}  # src, Counter (was node 3), out (was node 4)
    assert match.removed == ("audit", "audit-out")
    assert len(match.added) == 1 and match.added[0].startswith("map-")


def test_a_removed_stateful_operator_is_refused_naming_it_unless_allowed() -> None:
    why = refusal(job_of(v1), job_of(v2))
    assert why is not None and "Audit (uid 'audit', keyed_process)" in why and "DiscardSink (uid 'audit-out'" in why
    assert "--allow-non-restored-state" in why
    assert refusal(job_of(v1), job_of(v2), allow=True) is None


def test_a_removed_or_added_stateless_operator_needs_nothing() -> None:
    assert refusal(job_of(v2), job_of(v2)) is None
    without_map = job_of(lambda job: job.source(GeneratorSource(count=10), parallelism=2).uid("src").key_by(
        lambda r: r[0]).process(Count(), name="Counter").uid("count").sink(DiscardSink()).uid("out"))
    assert refusal(job_of(v2), without_map) is None
    assert refusal(without_map, job_of(v2)) is None


def test_a_savepoint_of_another_job_is_refused() -> None:
    other = job_of(lambda job: job.source(GeneratorSource(count=1)).map(str).sink(DiscardSink()))
    why = refusal(job_of(v1), other)
    assert why is not None and why.startswith("was taken from a different job graph: none of its operator uids")


def test_a_changed_kind_of_state_is_refused_naming_the_operator() -> None:
    def mapped(job: Job) -> None:
        (job.source(GeneratorSource(count=10), parallelism=2).uid("src").map(lambda r: r, name="Counter").uid("count")
            .sink(DiscardSink()).uid("out"))

    why = refusal(job_of(v2), job_of(mapped))
    assert why == ("operator Counter (uid 'count', keyed_process) kept keyed state, but the job's operator with that "
                   "uid is Counter (map), which keeps no state: its state cannot be restored into it; give the new "
                   "operator another uid (and restore with --allow-non-restored-state to drop the old state)")


def test_in_flight_data_on_an_edge_the_job_no_longer_has_is_refused() -> None:
    old = job_of(v1)
    graph = graph_of(old)
    # Count's input edge (src -> count) held in-flight data; v2 feeds Count from the added map instead
    count_edge = next(e["id"] for e in graph["edges"] if e["down_uid"] == "count")
    why = refusal(old, job_of(v2), allow=True, inflight={count_edge})
    assert why is not None and why.startswith("is an unaligned checkpoint with in-flight data on the edge src -> count")
    audit_edge = next(e["id"] for e in graph["edges"] if e["down_uid"] == "audit")
    assert refusal(old, job_of(v2), allow=True, inflight={audit_edge}) is not None  # the removed operator's input
    assert refusal(old, old, inflight={count_edge, audit_edge}) is None  # the same edges: restored into them


def test_the_edges_that_may_hold_in_flight_data_are_those_of_tasks_that_wrote_channel_state() -> None:
    graph = graph_of(job_of(v1))
    by_down = {e["down_uid"]: e["id"] for e in graph["edges"]}
    assert inflight_edges(graph, {"0:0": {"state": "a"}, "2:1": {"state": "b", "in": "c"}}) == {by_down["count"]}
    assert inflight_edges(graph, {"0:1": {"out": "d"}}) == set(by_down.values())


# -- the chaining keeps the checkpoint's task boundaries ------------------------------------------------------------

CHAIN = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([None, "rebalance"])), min_size=1, max_size=5)


def pipeline(steps: list[tuple[int, str | None]]) -> Job:
    job = Job("t")
    stream = job.source(GeneratorSource(count=1), parallelism=steps[0][0])
    for i, (p, partitioner) in enumerate(steps[1:]):
        stream = (stream.rebalance() if partitioner else stream).map(str, parallelism=p, name=f"m{i}")
    assign_uids(job)
    return job


@settings(max_examples=150, deadline=None)
@given(CHAIN, st.lists(st.integers(1, 3), min_size=5, max_size=5))
def test_chaining_with_the_checkpoints_groups_only_splits_its_tasks(steps: list[tuple[int, str | None]],
                                                                    now: list[int]) -> None:
    then = pipeline(steps)
    old_vertices, _ = chain_graph(then)
    groups = {n: v.id for v in old_vertices for n in v.nodes}
    job = pipeline([(p, part) for p, (_, part) in zip(now, steps, strict=False)])
    vertices, _ = chain_graph(job, groups)
    free, _ = chain_graph(job)
    for v in vertices:
        assert len({groups[n] for n in v.nodes}) == 1  # a former network edge stays one
        assert len({job.nodes[n].parallelism for n in v.nodes}) == 1
        assert any(set(v.nodes) <= set(f.nodes) for f in free)  # chains only where it would chain anyway
    if [n.parallelism for n in job.nodes] == [n.parallelism for n in then.nodes]:
        assert [v.nodes for v in vertices] == [v.nodes for v in old_vertices]


def test_two_tasks_at_one_parallelism_now_stay_two_tasks() -> None:
    then = pipeline([(1, None), (2, None)])  # source at 1, map at 2: a rebalance between two tasks
    groups = {n: v.id for v in chain_graph(then)[0] for n in v.nodes}
    now = pipeline([(3, None), (3, None)])
    assert [v.nodes for v in chain_graph(now)[0]] == [[0, 1]]
    vertices, edges = chain_graph(now, groups)
    assert [v.nodes for v in vertices] == [[0], [1]] and [e.partitioner for e in edges] == ["forward"]


# -- the restore plan renames state to the new node ids ------------------------------------------------------------

def plan_of(job: Job, groups: dict[int, int] | None = None) -> Plan:
    vertices, edges = chain_graph(job, groups)
    return Plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0, vertices=vertices,
                edges=edges, placement={}, workers={}, config=JobConfig(), graph=graph_document(job, vertices, edges))


def test_a_renamed_operator_restores_its_own_state_under_its_new_node_id() -> None:
    old, new = job_of(v1), job_of(v2)
    graph = graph_of(old)
    tasks = {f"{v['id']}:{j}": TaskFiles(state=f"{v['id']}-{j}.state") for v in graph["vertices"] for j in range(2)}
    spec = RestoreSpec(path="/sp", checkpoint_id=3, tasks=tasks, graph=graph)
    plan = plan_of(new, match_operators(graph, new).old_vertex_of_new)
    count_vertex = next(v for v in plan.vertices if 2 in v.nodes)
    steps = plan_restore(spec, plan, count_vertex, 0, new)
    assert steps.operator is not None and steps.operator.files == ("2-0.state",)  # the old task of Count and out
    assert steps.operator.cut.renamed == ((3, 2), (4, 3))
    assert steps.operator.cut.backend_moves == ((3, 2), (4, 3))  # Audit's state is in another old task's files
    # the old file: Count's keyed table under node 3; node 1 (Audit) lives in another old task's file
    document = decode_operator_state(encode_operator_state(
        {3: {"count": {"a": 5, "b": 7}}}, max_parallelism=128, source=None, sinks=[{"pending": []}],
        lists={3: {"l": ["split", [1]]}}), "2-0.state")
    restored = assemble(steps, {"2-0.state": document}, {}, {})
    assert restored is not None
    assert restored.keyed == {2: {"count": {"a": 5, "b": 7}}}
    assert restored.lists == {2: {"l": ["split", [1]]}} and restored.sinks == [{"pending": []}]
    added = next(v for v in plan.vertices if v.nodes == [0, 1])  # the source, with the added map chained to it
    assert plan_restore(spec, plan, added, 0, new).operator.cut.nodes == frozenset({0})  # type: ignore[union-attr]


def test_an_operator_added_in_a_task_of_its_own_starts_empty() -> None:
    old = job_of(v2)
    new = job_of(lambda job: v2(job) or job.source(GeneratorSource(count=1), parallelism=3).sink(DiscardSink()))
    graph = graph_of(old)
    spec = RestoreSpec(path="/sp", checkpoint_id=3, graph=graph,
                       tasks={f"{v['id']}:0": TaskFiles(state="x") for v in graph["vertices"]})
    plan = plan_of(new, match_operators(graph, new).old_vertex_of_new)
    assert plan_restore(spec, plan, plan.vertices[-1], 2, new).nothing


def test_a_backends_entries_move_to_the_new_node_ids_and_unmatched_ones_are_dropped() -> None:
    backend = MemoryBackend(range(0, 128))
    backend.put_many([("3/count", 1, "a", 5), ("2/count", 1, "a", 9), ("1/count", 2, "b", 4), ("4/x", 3, "c", 1)])
    renumber(backend, range(0, 128), {3: 2, 2: None, 4: 3})
    assert sorted(backend.scan(range(0, 128))) == [("1/count", 2, "b", 4), ("2/count", 1, "a", 5), ("3/x", 3, "c", 1)]


def test_restore_spec_carries_the_graph_over_the_wire() -> None:
    graph = graph_of(job_of(v1))
    spec = RestoreSpec(path="/sp", checkpoint_id=3, graph=graph)
    assert RestoreSpec.from_wire(msgpack.unpackb(msgpack.packb(spec.to_wire()), strict_map_key=False)) == replace(
        spec, graph=msgpack.unpackb(msgpack.packb(graph)))
