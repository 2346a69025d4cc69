"""The restore planner: exact plans from a checkpoint's metadata and the job graph (no files), and `assemble`
on in-memory state documents, where every key and every record in flight lands in exactly one new subtask."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from runtime.api import Job
from runtime.checkpointing.rescaling import RescaleError
from runtime.checkpointing.restore_plan import (
    FINISHED,
    NOTHING,
    Cut,
    OperatorStatePlan,
    OwnInputs,
    RedistributedInputs,
    RestorePlan,
    SourceRule,
    assemble,
    plan_restore,
)
from runtime.checkpointing.snapshots import channel_key, decode_operator_state, encode_operator_state
from runtime.connectors.generator import GeneratorSource
from runtime.connectors.sinks import DiscardSink
from runtime.connectors.source import Source
from runtime.examples.wordcount import Count
from runtime.graph.job_config import JobConfig
from runtime.graph.partitioning import key_group, key_group_range
from runtime.graph.plan import Plan, apply_parallelism, chain_graph
from runtime.graph.restore_spec import RestoreSpec, TaskFiles

CHECKPOINT_ID = 7


def counted(job: Job, source: Source | None = None) -> None:
    (job.source(source or GeneratorSource(count=10), parallelism=2).key_by(lambda r: r[0])
        .process(Count(), parallelism=2).sink(DiscardSink()))


def plan_at(parallelism: dict[str, int] | None = None, source: Source | None = None) -> tuple[Job, Plan]:
    job = Job("t")
    counted(job, source)
    if parallelism:
        apply_parallelism(job, parallelism)
    vertices, edges = chain_graph(job)
    return job, Plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0, vertices=vertices,
                     edges=edges, placement={}, workers={}, config=JobConfig())


def files(vertex: int, subtask: int, *kinds: str) -> TaskFiles:
    name = f"{vertex}-{subtask}"
    return TaskFiles(state=f"{name}.state", inputs=f"{name}.in" if "in" in kinds else None,
                     outputs=f"{name}.out" if "out" in kinds else None)


# the word count checkpointed at parallelism 2: source (vertex 0) -> hash edge 0 -> Count -> DiscardSink (vertex 1)
SPEC = RestoreSpec(path="/c/chk-7", checkpoint_id=CHECKPOINT_ID,
                   tasks={"0:0": files(0, 0, "out"), "0:1": files(0, 1, "out"),
                          "1:0": files(1, 0, "in"), "1:1": files(1, 1, "in")},
                   parallelism={0: 2, 1: 2}, nodes={0: 2, 1: 2, 2: 2})
COUNT_CUT = Cut(nodes=frozenset({1, 2}), sinks=(0,), source=False, backend=True)
SOURCE_CUT = Cut(nodes=frozenset({0}), sinks=(), source=True, backend=False)


def test_at_the_same_parallelism_a_task_reads_its_own_files() -> None:
    job, plan = plan_at()
    assert plan_restore(SPEC, plan, plan.vertices[1], 1, job) == RestorePlan(
        operator=OperatorStatePlan(("1-1.state",), COUNT_CUT), inputs=(OwnInputs(0, "1-1.in"),))
    assert plan_restore(SPEC, plan, plan.vertices[0], 0, job) == RestorePlan(
        operator=OperatorStatePlan(("0-0.state",), SOURCE_CUT, source=SourceRule.OWN), outputs_file="0-0.out",
        kept_outputs=frozenset({0}))


def test_a_rescaled_task_reads_the_overlapping_key_groups_and_every_old_channel_of_its_input() -> None:
    job, plan = plan_at({"Count": 3, "DiscardSink": 3})
    assert plan_restore(SPEC, plan, plan.vertices[1], 2, job) == RestorePlan(
        operator=OperatorStatePlan(("1-0.state", "1-1.state"), COUNT_CUT, key_groups=range(86, 128),
                                   overlapping=(1,), subtask=2, parallelism=3, checkpoint_id=CHECKPOINT_ID),
        inputs=(RedistributedInputs(0, 0, in_files=("1-0.in", "1-1.in"), out_files=("0-0.out", "0-1.out"),
                                    partitioner="hash", consumer=2, new_up=2, new_down=3, old_down=2,
                                    max_parallelism=128, timestamped=False),))
    # its producer keeps its own state but hands the edge's output channel state to the new consumers
    assert plan_restore(SPEC, plan, plan.vertices[0], 1, job) == RestorePlan(
        operator=OperatorStatePlan(("0-1.state",), SOURCE_CUT, source=SourceRule.OWN), outputs_file="0-1.out",
        kept_outputs=frozenset())


def test_a_rescaled_source_deals_lanes_and_one_that_cannot_split_is_refused_before_any_read() -> None:
    job, plan = plan_at({"*": 3})
    source_plan = plan_restore(SPEC, plan, plan.vertices[0], 0, job).operator
    assert source_plan is not None and source_plan.source is SourceRule.LANES
    job, plan = plan_at({"*": 3}, source=Source())
    with pytest.raises(RescaleError, match="cannot be split"):
        plan_restore(SPEC, plan, plan.vertices[0], 0, job)


def test_finished_and_new_tasks() -> None:
    job, plan = plan_at({"Count": 3, "DiscardSink": 3})
    done = RestoreSpec(path="/c", checkpoint_id=3, parallelism={0: 2, 1: 2}, tasks={"1:0": TaskFiles(finished=True),
                                                         "1:1": TaskFiles(finished=True)})
    assert plan_restore(done, plan, plan.vertices[1], 2, job) == FINISHED
    job, plan = plan_at()
    assert plan_restore(RestoreSpec(path="/c", checkpoint_id=3), plan, plan.vertices[1], 0, job) == NOTHING
    assert assemble(NOTHING, {}, {}, {}) is None and assemble(FINISHED, {}, {}, {}).finished  # type: ignore[union-attr]


def test_assembled_rescale_puts_every_key_and_every_record_in_flight_in_exactly_one_new_subtask() -> None:
    keys = [f"k{i}" for i in range(40)]
    operators: dict[str, dict[str, Any]] = {}
    for j in range(2):  # each old subtask holds the counts of its key groups
        groups = key_group_range(128, 2, j)
        table = {k: i for i, k in enumerate(keys) if key_group(k, 128) in groups}
        operators[f"1-{j}.state"] = decode_operator_state(encode_operator_state(
            {1: {"count": table}}, max_parallelism=128, source=None, sinks=[None]), "test")
    # in flight on the hash edge: old channel (j, k) holds records the consumer k had and producer j still held
    records = {(j, k): [[k_, j] for k_ in keys if key_group(k_, 128) in key_group_range(128, 2, k)][:5]
               for j in range(2) for k in range(2)}
    channels = {f"1-{k}.in": {channel_key(0, j, k): b"".join(msgpack.packb(r) for r in records[(j, k)][:2])
                              for j in range(2)} for k in range(2)}
    channels.update({f"0-{j}.out": {channel_key(0, j, k): b"".join(msgpack.packb(r) for r in records[(j, k)][2:])
                                    for k in range(2)} for j in range(2)})
    job, plan = plan_at({"Count": 3, "DiscardSink": 3})
    seen_keys: list[str] = []
    seen_records: list[Any] = []
    for i in range(3):
        steps = plan_restore(SPEC, plan, plan.vertices[1], i, job)
        assert set(steps.operator_files()) <= set(operators) and set(steps.channel_files()) <= set(channels)
        ids = {channel_key(0, j, i): 100 * j + i for j in range(2)}
        state = assemble(steps, operators, channels, ids)
        assert state is not None and state.keyed is not None
        table = state.keyed[1]["count"]
        assert all(key_group(k, 128) in key_group_range(128, 3, i) for k in table)
        seen_keys += table
        for cid, stream in (state.inputs or {}).items():
            unpacker = msgpack.Unpacker()
            unpacker.feed(stream)
            got = list(unpacker)
            assert all(key_group(r[0], 128) in key_group_range(128, 3, i) for r in got), cid
            seen_records += [tuple(r) for r in got]
    assert sorted(seen_keys) == sorted(keys)
    assert sorted(seen_records) == sorted(tuple(r) for rs in records.values() for r in rs)


def test_a_rescaled_non_keyed_async_map_deals_its_records_in_flight_round_robin() -> None:
    async def lookup(record: Any) -> Any:
        return record

    job = Job("t")
    (job.source(GeneratorSource(count=10), parallelism=2).rebalance()
        .async_map(lookup, parallelism=2).sink(DiscardSink()))
    operators = {}
    for j in range(2):  # old subtask j had 5 records (and a watermark) not yet emitted
        doc = {"format": 1, "kind": "io", "keyed": False, "subtask": j, "parallelism": 2,
               "replay": [["r", None, [j, n]] for n in range(5)] + [["w", 100]]}
        operators[f"1-{j}.state"] = decode_operator_state(encode_operator_state(
            {}, max_parallelism=128, source=None, sinks=[None], async_inflight={1: doc}), "test")
    apply_parallelism(job, {"async_map": 3, "DiscardSink": 3})
    vertices, edges = chain_graph(job)
    plan = Plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0, vertices=vertices,
                edges=edges, placement={}, workers={}, config=JobConfig())
    spec = RestoreSpec(path="/c/chk-7", checkpoint_id=CHECKPOINT_ID,
                       tasks={"0:0": files(0, 0), "0:1": files(0, 1), "1:0": files(1, 0), "1:1": files(1, 1)},
                       parallelism={0: 2, 1: 2}, nodes={0: 2, 1: 2, 2: 2})
    shares = []
    for i in range(3):
        state = assemble(plan_restore(spec, plan, plan.vertices[1], i, job), operators, {}, {})
        assert state is not None and state.async_inflight is not None
        [doc] = state.async_inflight[1]
        assert all(e[0] == "r" for e in doc["replay"])  # another subtask's watermark stays behind
        shares.append([tuple(e[2]) for e in doc["replay"]])
    assert sorted(r for share in shares for r in share) == [(j, n) for j in range(2) for n in range(5)]
    assert [len(share) for share in shares] == [4, 3, 3]
