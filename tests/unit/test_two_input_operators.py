"""Two-input operators in a chain (runtime/execution/operators/two_input.py): each input's records reach its own
side, keyed state and timers are shared by the sides, broadcast state is read only on the main side and is
snapshotted, restored and replicated on a rescale with the task's lists."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    BoundedOutOfOrderness,
    BroadcastStateError,
    CoProcessFunction,
    GeneratorSource,
    Job,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    MapStateDescriptor,
)
from runtime.checkpointing.rescaling import only_broadcast_state, rescale_lists
from runtime.checkpointing.restore_plan import assemble, plan_restore
from runtime.checkpointing.snapshots import channel_key, decode_operator_state, encode_operator_state
from runtime.examples.connect import RULES, ApplyRules, OrderPaymentJoin
from runtime.execution.operators import Chain
from runtime.execution.watermarks import IDLE, WatermarkCombiner
from runtime.graph.job_config import JobConfig
from runtime.graph.partitioning import key_group, key_group_range
from runtime.graph.plan import Plan, apply_parallelism, chain_graph
from runtime.graph.rescalability import rescale_refusal
from runtime.graph.restore_spec import RestoreSpec, TaskFiles
from tests.support.buffers import ListSink


def join_chain(timed: bool = False, fn: Any = None) -> tuple[Chain, ListSink, Job]:
    """orders (node 0) and payments (node 1, unioned with node 2) keyed by id into the join (3) -> sink (4)."""
    job = Job("join")
    sink = ListSink()
    watermarks = BoundedOutOfOrderness(0, timestamp=lambda r: r[2]) if timed else None
    orders = job.source(GeneratorSource(count=1), watermarks=watermarks)
    payments = job.source(GeneratorSource(count=1), watermarks=watermarks)
    more = job.source(GeneratorSource(count=1), watermarks=watermarks)
    (orders.key_by(lambda o: o[0])
        .connect(payments.union(more).key_by(lambda p: p[0]))
        .process(fn or OrderPaymentJoin(), name="join")
        .sink(sink))
    chain = Chain(job, [3, 4], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    return chain, sink, job


@settings(max_examples=80, deadline=None)
@given(ids=st.lists(st.integers(0, 40), unique=True, max_size=40), data=st.data())
def test_every_order_meets_its_payment_once_whatever_the_interleaving(ids: list[int], data: st.DataObject) -> None:
    chain, sink, _ = join_chain()
    # edge 0 is the orders input, edges 1 and 2 the two unioned payment inputs
    events = [(0, (i, f"c{i}")) for i in ids] + [(1 + i % 2, (i, f"m{i}")) for i in ids]
    order = data.draw(st.permutations(events))
    k = 0
    while k < len(order):
        size = data.draw(st.integers(1, 5))
        batch = order[k:k + size]
        for edge in {e for e, _ in batch}:  # a batch comes from one channel: one edge at a time
            chain.input_batch(edge)([r for e, r in batch if e == edge])
        k += size
    assert sorted(sink.out) == sorted((i, f"c{i}", f"m{i}") for i in ids)
    assert all(not table for table in chain.keyed_state[3].values() if table is not None)


class Expire(KeyedCoProcessFunction):
    """A payment without its order by the watermark at its time + 10 is reported; timers from both sides."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.value_state("seen", default=0)

    def process1(self, record: Any, ctx: Any) -> None:
        self.seen.update(self.seen.value() | 1)
        ctx.timers.register_event_time(ctx.timestamp + 10)

    def process2(self, record: Any, ctx: Any) -> None:
        self.seen.update(self.seen.value() | 2)
        ctx.timers.register_event_time(ctx.timestamp + 10)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        ctx.emit((ctx.current_key, self.seen.value(), timestamp, ctx.current_watermark))


def test_keyed_state_and_timers_are_shared_by_both_sides() -> None:
    chain, sink, _ = join_chain(timed=True, fn=Expire())
    chain.input_batch(0)([(100, ("a", 0, 100)), (105, ("b", 0, 105))])
    chain.input_batch(1)([(102, ("a", 0, 102))])
    chain.input_batch(2)([(103, ("c", 0, 103))])
    timers = chain.timers
    assert timers is not None
    timers.set_watermark(112)
    assert not timers.fire_event(112, 100)
    # "a": one timer from each side, deduplicated per (key, timestamp) only where they coincide
    assert sorted(sink.out) == [("a", 3, 110, 112), ("a", 3, 112, 112)]
    timers.set_watermark(200)
    timers.fire_event(200, 100)
    assert sorted(r[:3] for r in sink.out[2:]) == [("b", 1, 115), ("c", 2, 113)]


def rules_chain(lists: dict[int, Any] | None = None, fn: Any = None) -> tuple[Chain, ListSink]:
    job = Job("rules")
    sink = ListSink()
    rules = job.source(GeneratorSource(count=1))
    events = job.source(GeneratorSource(count=1))
    events.key_by(lambda e: e[0]).connect(rules.broadcast(RULES)).process(fn or ApplyRules(), parallelism=3).sink(sink)
    chain = Chain(job, [2, 3], subtask_index=1, parallelism=3, attempt=0, outputs=[])
    if lists is not None:
        chain.restore_lists(lists)
    chain.open()
    return chain, sink


def test_broadcast_state_is_written_by_the_broadcast_side_and_read_by_the_main_side() -> None:
    chain, sink = rules_chain()
    assert sink.out == [("opened", 1, 3, [])]
    chain.input_batch(1)([("over-10", 10), ("over-50", 50)])
    chain.input_batch(0)([("k", 20), ("k", 60), ("j", 5)])
    assert sink.out[1:] == [("event", "k", 20, 2, 3, ["over-10"]), ("event", "k", 60, 2, 3, ["over-10", "over-50"]),
                            ("event", "j", 5, 2, 3, [])]
    snapshot = chain.snapshot_lists()
    assert snapshot == {2: {"rules": ["broadcast", {"over-10": 10, "over-50": 50}]}}
    chain.input_batch(1)([("over-0", 0)])  # the snapshot is a copy: later writes do not reach it
    assert snapshot[2]["rules"][1] == {"over-10": 10, "over-50": 50}
    # restored before open: the function starts with the rules
    again, out = rules_chain(snapshot)
    assert out.out == [("opened", 1, 3, ["over-10", "over-50"])]


class Cheat(KeyedBroadcastProcessFunction):
    def process_element(self, record: Any, ctx: Any) -> None:
        ctx.broadcast_state(RULES).put("mine", 1)

    def process_broadcast_element(self, record: Any, ctx: Any) -> None:
        assert ctx.current_key is None
        ctx.broadcast_state(MapStateDescriptor("other"))


def test_broadcast_state_is_read_only_on_the_main_side_and_named_by_its_descriptors() -> None:
    chain, _ = rules_chain(fn=Cheat())
    with pytest.raises(BroadcastStateError, match="read only in process_element"):
        chain.input_batch(0)([("k", 1)])
    with pytest.raises(KeyError, match="no broadcast state 'other'"):
        chain.input_batch(1)([("r", 1)])


def test_broadcast_state_replicates_on_a_rescale_beside_keyed_state() -> None:
    old = [{2: {"rules": ["broadcast", {"a": 1}]}}, {2: {"rules": ["broadcast", {"a": 1, "b": 2}]}}]
    assert only_broadcast_state(old) and not only_broadcast_state([{2: {"x": ["split", [1]]}}, None])
    for subtask in range(3):
        mine = rescale_lists(old, 3, subtask, replicated=True)
        assert mine == {2: {"rules": ["broadcast", old[subtask % 2][2]["rules"][1]]}}
        assert mine[2]["rules"][1] is not old[subtask % 2][2]["rules"][1]  # a copy
    job = Job("rules")
    rules = job.source(GeneratorSource(count=1), name="rules")
    events = job.source(GeneratorSource(count=1), name="events", parallelism=2)
    events.key_by(lambda e: e[0]).connect(rules.broadcast(RULES)).process(ApplyRules(), name="apply").sink(
        ListSink(), name="out")
    vertices, edges = chain_graph(job)
    assert rescale_refusal(job, vertices, edges, {0: 1, 1: 1, 2: 3, 3: 3}) is None


def test_a_rescaled_keyed_broadcast_task_takes_keys_by_group_and_its_replicas_rules_with_their_channel() -> None:
    """Old apply subtask 0 had rule a and rule b still in flight to it; old subtask 1 had both. Every new subtask
    ends with both rules (state + replayed channel), and every key and every event in flight lands once."""
    job = Job("rules")
    rules = job.source(GeneratorSource(count=1), name="rules", parallelism=1)
    events = job.source(GeneratorSource(count=1), name="events", parallelism=2)
    events.key_by(lambda e: e[0]).connect(rules.broadcast(RULES)).process(ApplyRules(), name="apply").sink(
        ListSink(), name="sink")
    apply_parallelism(job, {"apply": 3, "sink": 3})
    vertices, edges = chain_graph(job)
    plan = Plan(job_id="j", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0, vertices=vertices,
                edges=edges, placement={}, workers={}, config=JobConfig())
    main = next(e for e in edges if e.partitioner == "hash")
    bcast = next(e for e in edges if e.partitioner == "broadcast")

    def files(name: str, *kinds: str) -> TaskFiles:
        return TaskFiles(state=f"{name}.state", inputs=f"{name}.in" if "in" in kinds else None,
                         outputs=f"{name}.out" if "out" in kinds else None)

    spec = RestoreSpec(path="/c/chk-7", checkpoint_id=7,
                       tasks={"0:0": files("r"), "1:0": files("e0", "out"), "1:1": files("e1", "out"),
                              "2:0": files("a0", "in"), "2:1": files("a1", "in")},
                       parallelism={0: 1, 1: 2, 2: 2}, nodes={0: 1, 1: 2, 2: 2, 3: 2})
    keys = [f"k{i}" for i in range(30)]
    rules_of = [{"a": 1}, {"a": 1, "b": 2}]
    operators = {}
    for j in range(2):
        groups = key_group_range(128, 2, j)
        operators[f"a{j}.state"] = decode_operator_state(encode_operator_state(
            {2: {"seen": {k: j for k in keys if key_group(k, 128) in groups}}}, max_parallelism=128, source=None,
            sinks=[None], lists={2: {"rules": ["broadcast", rules_of[j]]}}), "test")
    events_in_flight = {(p, c): [[k, p] for k in keys if key_group(k, 128) in key_group_range(128, 2, c)][:4]
                        for p in range(2) for c in range(2)}
    channels: dict[str, dict[str, bytes]] = {
        f"a{c}.in": {**{channel_key(main.id, p, c): b"".join(msgpack.packb(r) for r in events_in_flight[(p, c)])
                        for p in range(2)},
                     channel_key(bcast.id, 0, c): msgpack.packb(["b", 2]) if c == 0 else b""}
        for c in range(2)}
    channels.update({f"e{p}.out": {} for p in range(2)})
    seen_keys: list[str] = []
    seen_events: list[Any] = []
    for i in range(3):
        steps = plan_restore(spec, plan, plan.vertices[main.down], i, job)
        ids = {**{channel_key(main.id, p, i): 10 * p + i for p in range(2)}, channel_key(bcast.id, 0, i): 99}
        state = assemble(steps, operators, channels, ids)
        assert state is not None and state.keyed is not None and state.lists is not None
        broadcast = dict(state.lists[2]["rules"][1])
        for record in msgpack.Unpacker(BytesIO((state.inputs or {}).get(99, b""))):
            broadcast[record[0]] = record[1]
        assert broadcast == {"a": 1, "b": 2}, (i, state.lists, state.inputs)
        seen_keys += state.keyed[2]["seen"]
        for cid, stream in (state.inputs or {}).items():
            if cid != 99:
                seen_events += [tuple(r) for r in msgpack.Unpacker(BytesIO(stream))]
    assert sorted(seen_keys) == sorted(keys)
    assert sorted(seen_events) == sorted(tuple(r) for rs in events_in_flight.values() for r in rs)


def test_the_watermark_is_the_minimum_over_both_inputs_and_an_idle_input_does_not_hold_it_back() -> None:
    """A two-input task combines the channels of both inputs (edge 0: orders from two producers, edge 1:
    payments from one); the operator gets the result."""
    combiner = WatermarkCombiner(["0:0:0", "0:1:0", "1:0:0"])
    assert combiner.on_marker("0:0:0", 100).watermark is None
    assert combiner.on_marker("0:1:0", 120).watermark is None  # the payments input has no watermark yet
    assert combiner.on_marker("1:0:0", 90).watermark == 90
    assert combiner.on_marker("1:0:0", 300).watermark == 100  # now the orders hold it back
    assert combiner.on_marker("0:0:0", 500).watermark == 120
    assert combiner.on_marker("1:0:0", IDLE).watermark is None  # idle payments: the orders alone decide
    assert combiner.on_marker("0:1:0", 700).watermark == 500
    chain, _, _ = join_chain(timed=True, fn=Expire())
    chain.forward_watermark(combiner.current)
    assert chain.operators[0].ctx is not None and chain.operators[0].ctx.current_watermark == 500


def test_list_state_beside_a_broadcast_input_is_still_refused_on_a_rescale() -> None:
    """A CoProcessFunction fed by a broadcast stream and another one: its list state would need both rules."""
    class Both(CoProcessFunction):
        def process1(self, record: Any, ctx: Any) -> None:
            pass

        def process2(self, record: Any, ctx: Any) -> None:
            pass

    job = Job("co")
    a = job.source(GeneratorSource(count=1), name="a", parallelism=2)
    b = job.source(GeneratorSource(count=1), name="b", parallelism=2)
    a.connect(b.broadcast()).process(Both(), name="both").sink(ListSink(), name="out")
    vertices, edges = chain_graph(job)
    refusal = rescale_refusal(job, vertices, edges, {0: 2, 1: 2, 2: 3, 3: 3})
    assert refusal is not None and refusal.startswith("both reads a broadcast input and another one"), refusal
