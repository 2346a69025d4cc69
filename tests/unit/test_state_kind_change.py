"""A state declared under the same name but as another kind after an upgrade is refused before anything runs:
the checkpoint records the kinds each operator's function declares (read from its source, not run), and a
restore into a version that declares another kind under that name is one line naming the operator's uid, the
state and both kinds."""

from __future__ import annotations

from typing import Any

from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction
from runtime.api.schema import declared_state_kinds
from runtime.graph.evolution import evolution_refusal, kind_change
from runtime.graph.operator_ids import graph_document
from runtime.graph.plan import chain_graph


class DedupV1(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ctx.value_state("seen", default=False)
        self.recent = ctx.list_state(name="recent")
        self.dynamic = ctx.value_state(f"dyn-{ctx.subtask_index}")  # built at run time: not seen

    def process_element(self, record: Any, ctx: Any) -> None:
        if not self.seen.value():
            self.seen.update(True)
            ctx.emit(record)


class DedupV2(KeyedProcessFunction):
    """The upgrade: "seen" became a map of the values seen per key."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.map_state("seen")
        self.recent = ctx.list_state("recent")

    def process_element(self, record: Any, ctx: Any) -> None:
        if not self.seen.contains(record[1]):
            self.seen.put(record[1], True)
            ctx.emit(record)


class DedupV3(DedupV1):
    """A subclass that only adds a state: its base's declarations count too."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.total = ctx.reducing_state("total", lambda a, b: a + b)


def job_with(function: KeyedProcessFunction) -> Job:
    job = Job("dedup")
    (job.source(GeneratorSource(count=10), parallelism=1).uid("words").key_by(lambda r: r[0])
        .process(function, parallelism=1).uid("dedup").sink(DiscardSink()).uid("out"))
    return job


def recorded(job: Job) -> dict[str, Any]:
    vertices, edges = chain_graph(job)
    return graph_document(job, vertices, edges)


def test_the_kinds_a_function_declares_are_read_from_its_source() -> None:
    assert declared_state_kinds(DedupV1()) == {"seen": "value", "recent": "list"}
    assert declared_state_kinds(DedupV2()) == {"seen": "map", "recent": "list"}
    assert declared_state_kinds(DedupV3()) == {"seen": "value", "recent": "list", "total": "reducing"}
    assert declared_state_kinds(lambda r: r) == {}


def test_the_checkpoint_records_them_per_operator() -> None:
    operators = {op["uid"]: op for op in recorded(job_with(DedupV1()))["operators"]}
    assert operators["dedup"]["states"] == {"seen": "value", "recent": "list"}
    assert "states" not in operators["words"] and "states" not in operators["out"]


def test_a_state_whose_kind_changed_under_its_name_is_refused_in_one_line() -> None:
    graph = recorded(job_with(DedupV1()))
    refusal = evolution_refusal(graph, job_with(DedupV2()), allow_non_restored_state=False, inflight_edges=(),
                                new_edges=[])
    assert refusal == ("operator uid 'dedup': state 'seen' was a value state and is declared as a map state now: "
                       "its stored values cannot be read as that; keep its kind, or give the new state another "
                       "name (it starts empty)")
    # dropping the old state does not make a map of a value either
    assert evolution_refusal(graph, job_with(DedupV2()), allow_non_restored_state=True, inflight_edges=(),
                             new_edges=[]) == refusal


def test_same_kinds_added_states_and_checkpoints_without_kinds_restore() -> None:
    graph = recorded(job_with(DedupV1()))
    for version in (DedupV1(), DedupV3()):
        assert evolution_refusal(graph, job_with(version), allow_non_restored_state=False, inflight_edges=(),
                                 new_edges=[]) is None
    older = {**graph, "operators": [{k: v for k, v in op.items() if k != "states"} for op in graph["operators"]]}
    assert evolution_refusal(older, job_with(DedupV2()), allow_non_restored_state=False, inflight_edges=(),
                             new_edges=[]) is None
    assert kind_change({"uid": "x", "states": {"n": "aggregating"}}, DedupV1()) is None  # no common name
