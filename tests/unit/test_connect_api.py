"""The two-input API (runtime/api/co_functions.py, ConnectedStreams): what it builds and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.api import (
    BoundedOutOfOrderness,
    BroadcastProcessFunction,
    BroadcastState,
    BroadcastStateError,
    CoProcessFunction,
    GeneratorSource,
    Job,
    JobDefinitionError,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    MapStateDescriptor,
    PrintSink,
)
from runtime.graph.plan import chain_graph

RULES = MapStateDescriptor("rules")


class Join(KeyedCoProcessFunction):
    def process1(self, record: Any, ctx: Any) -> None:
        pass

    def process2(self, record: Any, ctx: Any) -> None:
        pass


class Merge(CoProcessFunction):
    def process1(self, record: Any, ctx: Any) -> None:
        ctx.emit(record)

    def process2(self, record: Any, ctx: Any) -> None:
        ctx.emit(record)


class Rules(KeyedBroadcastProcessFunction):
    def process_element(self, record: Any, ctx: Any) -> None:
        pass

    def process_broadcast_element(self, record: Any, ctx: Any) -> None:
        pass


class PlainRules(BroadcastProcessFunction):
    def process_element(self, record: Any, ctx: Any) -> None:
        pass

    def process_broadcast_element(self, record: Any, ctx: Any) -> None:
        pass


def two_sources(job: Job) -> tuple[Any, Any]:
    return (job.source(GeneratorSource(10), name="orders", parallelism=2),
            job.source(GeneratorSource(10), name="payments", parallelism=3))


def test_keyed_connect_builds_one_node_with_two_sides_and_its_edges() -> None:
    job = Job()
    orders, payments = two_sources(job)
    extra = job.source(GeneratorSource(5), name="late-payments")
    joined = orders.key_by(lambda r: r % 5).connect(payments.union(extra).key_by(lambda r: r % 5)).process(
        Join(), parallelism=4, name="join")
    joined.sink(PrintSink())
    node = job.nodes[joined.node_id]
    assert node.kind == "keyed_co_process" and node.two_input and node.parallelism == 4
    assert [(i.node, i.side, i.partitioner) for i in node.inputs] == [(0, 0, "hash"), (1, 1, "hash"),
                                                                       (2, 1, "hash")]
    assert node.key_fn is not None
    vertices, edges = chain_graph(job)
    into = sorted((e.input_index, e.up) for e in edges if e.down == vertices[-1].id)
    assert into == [(0, 0), (1, 1), (2, 2)]  # never chained to either upstream


def test_a_keyed_side_beside_an_unkeyed_one_is_refused() -> None:
    job = Job()
    orders, payments = two_sources(job)
    with pytest.raises(JobDefinitionError, match="only the first input is keyed"):
        orders.key_by(lambda r: r).connect(payments).process(Join())
    with pytest.raises(JobDefinitionError, match="only the second input is keyed"):
        orders.connect(payments.key_by(lambda r: r)).process(Merge())


def test_a_keyed_function_on_unkeyed_streams_is_refused() -> None:
    job = Job()
    orders, payments = two_sources(job)
    with pytest.raises(JobDefinitionError, match="KeyedCoProcessFunction needs keyed inputs"):
        orders.connect(payments).process(Join())


def test_declared_key_types_must_agree() -> None:
    job = Job()
    orders, payments = two_sources(job)
    with pytest.raises(JobDefinitionError, match="key_type 'order_id' on the first input, 'user_id'"):
        orders.key_by(lambda r: r, key_type="order_id").connect(
            payments.key_by(lambda r: r, key_type="user_id")).process(Join())
    # agreeing, or one side undeclared: accepted
    orders.key_by(lambda r: r, key_type=int).connect(payments.key_by(lambda r: r, key_type=int)).process(Join())
    orders.key_by(lambda r: r, key_type=int).connect(payments.key_by(lambda r: r)).process(Join())


def test_a_broadcast_stream_without_a_descriptor_is_refused() -> None:
    job = Job()
    events, rules = two_sources(job)
    with pytest.raises(JobDefinitionError, match="without a descriptor"):
        events.key_by(lambda r: r).connect(rules.broadcast()).process(Rules())
    with pytest.raises(JobDefinitionError, match="takes MapStateDescriptors"):
        rules.broadcast("rules")  # type: ignore[call-overload]


def test_broadcast_functions_match_the_main_input() -> None:
    job = Job()
    events, rules = two_sources(job)
    with pytest.raises(JobDefinitionError, match="needs a keyed main input"):
        events.connect(rules.broadcast(RULES)).process(Rules())
    with pytest.raises(JobDefinitionError, match="use a KeyedBroadcastProcessFunction"):
        events.key_by(lambda r: r).connect(rules.broadcast(RULES)).process(PlainRules())
    with pytest.raises(JobDefinitionError, match="runs a BroadcastProcessFunction"):
        events.connect(rules.broadcast(RULES)).process(Merge())
    out = events.key_by(lambda r: r).connect(rules.broadcast(RULES)).process(Rules())
    node = job.nodes[out.node_id]
    assert node.kind == "keyed_broadcast_process" and node.broadcast_descriptors == (RULES,)
    assert [(i.side, i.partitioner) for i in node.inputs] == [(0, "hash"), (1, "broadcast")]


def test_two_input_functions_are_refused_on_one_input() -> None:
    job = Job()
    orders, _ = two_sources(job)
    with pytest.raises(JobDefinitionError, match="has two inputs"):
        orders.process(Merge())
    with pytest.raises(JobDefinitionError, match="is not a ProcessFunction"):
        orders.key_by(lambda r: r).process(Join())  # type: ignore[arg-type]


def test_broadcast_state_is_read_only_where_it_must_be() -> None:
    table: dict[Any, Any] = {}
    BroadcastState(table, True, "rules").put("a", 1)
    view = BroadcastState(table, False, "rules")
    assert view.get("a") == 1 and "a" in view and view.items() == [("a", 1)] and len(view) == 1
    for write in (lambda: view.put("b", 2), lambda: view.remove("a"), view.clear, lambda: view.put_all({})):
        with pytest.raises(BroadcastStateError, match="read only in process_element"):
            write()
    assert table == {"a": 1}


def test_with_idleness_sets_the_idle_timeout() -> None:
    strategy = BoundedOutOfOrderness(10, timestamp=lambda r: r)
    assert strategy.with_idleness(500).idle_timeout_ms == 500 and strategy.idle_timeout_ms is None
    with pytest.raises(ValueError, match="idle_timeout_ms"):
        strategy.with_idleness(0)
