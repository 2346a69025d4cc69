"""Rescaling a job some of whose tasks reached their end (the idea of Flink's FLIP-147): the checkpoint records
them ("finished" from the coordinator, "ended" from the task), and a restore at any parallelism keeps an
operator all of whose subtasks finished finished, restores one all of whose subtasks ended at its end, and a
partly finished one like a running one whose finished subtasks have no state. Pure plan logic, no files."""

from __future__ import annotations

from typing import Any

from runtime.api import GeneratorSource, Job, KeyedBroadcastProcessFunction
from runtime.checkpointing.restore_plan import (
    FINISHED,
    RedistributedInputs,
    SourceRule,
    assemble,
    plan_restore,
    subtasks_at_end,
)
from runtime.checkpointing.snapshots import decode_operator_state, encode_operator_state
from runtime.connectors.sinks import DiscardSink
from runtime.connectors.source import Source
from runtime.examples.connect import RULES
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import Plan, apply_parallelism, chain_graph
from runtime.graph.rescalability import ended_operators, rescale_refusal
from runtime.graph.restore_spec import RestoreSpec, TaskFiles


class Rules(Source):
    """A bounded source that cannot split its input (neither rescalable nor subtask_splits)."""


class Enrich(KeyedBroadcastProcessFunction):
    def process_broadcast_element(self, rule: Any, ctx: Any) -> None:
        ctx.broadcast_state(RULES).put(rule[0], rule[1])

    def process_element(self, event: Any, ctx: Any) -> None:
        ctx.emit(event)


def broadcast_job(parallelism: dict[str, int] | None = None) -> tuple[Job, Plan]:
    """events (p 2) keyed -> connect(rules (p 1) broadcast) -> enrich -> sink; vertices: events 0, rules 1,
    enrich -> sink 2."""
    job = Job("t")
    events = job.source(GeneratorSource(count=10), name="events", parallelism=2)
    rules = job.source(Rules(), name="rules", parallelism=1)
    (events.key_by(lambda e: e[0]).connect(rules.broadcast(RULES))
        .process(Enrich(), name="enrich", parallelism=2).sink(DiscardSink(), name="sink"))
    if parallelism:
        apply_parallelism(job, parallelism)
    vertices, edges = chain_graph(job)
    return job, Plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0, vertices=vertices,
                     edges=edges, placement={}, workers={}, config=JobConfig())


def state(vertex: int, subtask: int, **marks: bool) -> TaskFiles:
    name = f"{vertex}-{subtask}"
    return TaskFiles(state=f"{name}.state", inputs=f"{name}.in", outputs=f"{name}.out", **marks)


def spec(rules: TaskFiles) -> RestoreSpec:
    """The broadcast job checkpointed at its first parallelisms, with the rules task's ack `rules`."""
    return RestoreSpec(path="/c/chk-4", checkpoint_id=4,
                       tasks={"0:0": state(0, 0), "0:1": state(0, 1), "1:0": rules, "2:0": state(2, 0),
                              "2:1": state(2, 1)},
                       parallelism={0: 2, 1: 1, 2: 2}, nodes={0: 2, 1: 1, 2: 2, 3: 2})


def test_the_vertices_of_the_broadcast_job() -> None:
    _, plan = broadcast_job()
    assert [(v.name, v.parallelism) for v in plan.vertices] == [("events", 2), ("rules", 1), ("enrich -> sink", 2)]


def test_a_finished_source_that_cannot_split_stays_finished_at_any_parallelism() -> None:
    job, plan = broadcast_job({"*": 3})
    done = spec(TaskFiles(finished=True))
    for subtask in range(3):
        assert plan_restore(done, plan, plan.vertices[1], subtask, job) == FINISHED
    # its consumers continue their replicas, broadcast state and broadcast channel state together
    enrich = plan_restore(done, plan, plan.vertices[2], 2, job)
    assert not enrich.finished and not enrich.ended and enrich.operator is not None and enrich.operator.replicated
    broadcast = [p for p in enrich.inputs if isinstance(p, RedistributedInputs) and p.partitioner == "broadcast"]
    assert len(broadcast) == 1 and broadcast[0].out_files == (None,)  # a finished task holds nothing in flight


def test_the_coordinator_refuses_a_source_that_cannot_split_unless_it_was_at_its_end() -> None:
    job, plan = broadcast_job({"*": 3})
    old = {0: 2, 1: 1, 2: 2, 3: 2}
    refusal = rescale_refusal(job, plan.vertices, plan.edges, old)
    assert refusal is not None and refusal.startswith("source rules (Rules) cannot be restored at parallelism 3")
    assert rescale_refusal(job, plan.vertices, plan.edges, old, ended=frozenset({1})) is None
    # an operator at its end does not excuse another one
    assert rescale_refusal(job, plan.vertices, plan.edges, old, ended=frozenset({0})) == refusal


def test_ended_operators_are_those_every_subtask_of_which_finished_or_ended() -> None:
    vertices = [{"id": 0, "parallelism": 2, "nodes": [0]}, {"id": 1, "parallelism": 1, "nodes": [1]},
                {"id": 2, "parallelism": 2, "nodes": [2, 3]}]
    acks: dict[str, dict[str, Any]] = {"0:0": {"finished": True}, "0:1": {"state": "s"}, "1:0": {"ended": "true"},
                                       "2:0": {"finished": True}, "2:1": {"ended": "true", "state": "s"}}
    assert ended_operators(vertices, acks) == frozenset({1, 2, 3})
    assert ended_operators(vertices, {}) == frozenset()
    assert ended_operators([{"id": 0, "parallelism": 1}], {"0:0": {"finished": True}}) == frozenset()  # no nodes


def test_a_source_at_its_end_restores_at_its_end_without_a_source_position() -> None:
    job, plan = broadcast_job({"*": 3})
    ended = plan_restore(spec(state(1, 0, ended=True)), plan, plan.vertices[1], 2, job)
    assert ended.ended and not ended.finished and ended.operator is not None
    assert ended.operator.source is SourceRule.NONE  # it reads nothing more: its position is not split
    assert ended.operator.files == ("1-0.state",)  # its sinks and lists still come along


def test_subtasks_at_end() -> None:
    done, end, running = TaskFiles(finished=True), TaskFiles(state="s", ended=True), TaskFiles(state="s")
    assert subtasks_at_end([done, done]) == (True, True)
    assert subtasks_at_end([done, end]) == (False, True)
    assert subtasks_at_end([done, running]) == (False, False)
    assert subtasks_at_end([done, None]) == (False, False)  # a subtask that acknowledged nothing: not at its end
    assert subtasks_at_end([]) == (False, False)


def test_a_partly_finished_source_deals_only_what_its_running_subtasks_have_left() -> None:
    """Old events subtask 0 finished (no state), subtask 1 had read nothing yet: its lane (units 1, 3, 5, ...)
    is all the three new subtasks read; old subtask 0's units are never read again."""
    job, plan = broadcast_job({"events": 3})
    rules = TaskFiles(finished=True)
    checkpoint = RestoreSpec(path="/c/chk-4", checkpoint_id=4,
                             tasks={"0:0": TaskFiles(finished=True), "0:1": state(0, 1), "1:0": rules,
                                    "2:0": state(2, 0), "2:1": state(2, 1)},
                             parallelism={0: 2, 1: 1, 2: 2}, nodes={0: 2, 1: 1, 2: 2, 3: 2})
    doc = decode_operator_state(encode_operator_state({}, max_parallelism=128, source=[None, 0], sinks=[]), "test")
    lanes = []
    for subtask in range(3):
        restore = plan_restore(checkpoint, plan, plan.vertices[0], subtask, job)
        assert not restore.finished and not restore.ended and restore.operator is not None
        assert restore.operator.files == (None, "0-1.state") and restore.operator.source is SourceRule.LANES
        assembled = assemble(restore, {"0-1.state": doc}, {"0-1.out": {}}, {})
        assert assembled is not None and not assembled.finished
        lanes += assembled.source[0]["lanes"]
    assert lanes and all(lane[0] % 2 == 1 and lane[3] % 2 == 0 for lane in lanes), lanes
    assert sorted(lane[0] for lane in lanes) == [1, 3, 5]  # lane 1 of stride 2 split in three of stride 6
