"""The DataStream-style job API.

A job module exposes `build(job)`; every process (coordinator and workers)
imports it and calls it, so the job graph is rebuilt identically everywhere
and no user code ever travels over the network. Node ids are assigned in
creation order, which is what makes the graphs agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, overload

from runtime.api.async_functions import AsyncKeyedProcessFunction
from runtime.api.async_io import NO_RETRY, AsyncFn, AsyncMap, RetryPolicy
from runtime.api.co_functions import (
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    MapStateDescriptor,
)
from runtime.api.errors import JobDefinitionError
from runtime.api.functions import KeyedProcessFunction, OutputTag, ProcessFunction
from runtime.api.interval_join import IntervalJoin
from runtime.api.joins import TwoStreams
from runtime.api.time import BoundedOutOfOrderness
from runtime.api.windows import WindowAssigner, WindowedStream
from runtime.common import state_backends
from runtime.connectors.sinks import Sink
from runtime.connectors.source import Source

DEFAULT_MAX_PARALLELISM = 128
DEFAULT_SLOT_SHARING_GROUP = "default"
PARTITIONERS = ("forward", "hash", "rebalance", "broadcast")
STATE_BACKENDS = state_backends.NAMES  # runtime/state/registry.py builds them


@dataclass
class Input:
    """One input edge of a node: the upstream node, how records are partitioned, which output of it."""

    node: int
    partitioner: str | None  # None: forward when parallelism matches, else rebalance
    key_fn: Callable[[Any], Any] | None = None
    tag: str | None = None  # a side output of `node` (OutputTag name), not its main output
    side: int = 0  # which input of a two-input operator this edge feeds (0: first, 1: second); 0 otherwise


@dataclass
class Node:
    """One operator of the job graph, with its user function (or source, or sink) and its input edges."""

    id: int
    kind: str  # source | map | filter | flat_map | async_map | process | keyed_process | reduce | sink
    name: str
    parallelism: int
    payload: Any  # the user function, source or sink
    inputs: list[Input] = field(default_factory=list)
    key_fn: Callable[[Any], Any] | None = None  # for keyed operators: the key of the records they receive
    watermarks: BoundedOutOfOrderness | None = None  # for sources with event time
    # a broadcast process function: the broadcast states its broadcast input was made with
    broadcast_descriptors: tuple[MapStateDescriptor, ...] = ()
    # the operator's stable id (`.uid("...")`): its state in a checkpoint belongs to it across versions of the
    # job; "" until set, then build_job fills in the default (runtime/graph/operator_ids.py)
    uid: str = ""
    # the operators of one slot sharing group share slots (subtask i of each in slot i of the group); another
    # group gets slots of its own, so it runs in another worker process (`.slot_sharing_group("...")`)
    slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP

    @property
    def two_input(self) -> bool:
        """An operator with two inputs (connect): its edges say which one they feed (Input.side)."""
        return self.kind in TWO_INPUT_KINDS


class Job:
    """Collects the graph of a job; `build(job)` in a job module fills it."""

    def __init__(self, name: str = "job", *, max_parallelism: int = DEFAULT_MAX_PARALLELISM,
                 default_parallelism: int = 1, state_backend: str | None = None) -> None:
        self.name = name
        self.max_parallelism = max_parallelism
        self.default_parallelism = default_parallelism
        self.nodes: list[Node] = []
        self._state_backend: str | None = None
        self.state_backend = state_backend

    @property
    def state_backend(self) -> str | None:
        """The job's default state backend ("memory", "rocksdb", "remote"; None: memory). `--state-backend`
        on `sluice submit|local` wins over it. A job module may set it in `build`: `job.state_backend = ...`."""
        return self._state_backend

    @state_backend.setter
    def state_backend(self, kind: str | None) -> None:
        if kind is not None and kind not in STATE_BACKENDS:
            raise JobDefinitionError(f"unknown state backend {kind!r}: choose one of {', '.join(STATE_BACKENDS)}")
        self._state_backend = kind

    def _add(self, kind: str, payload: Any, parallelism: int | None, name: str | None,
             inputs: list[Input], key_fn: Callable[[Any], Any] | None = None) -> Node:
        if parallelism is None:
            parallelism = self.nodes[inputs[0].node].parallelism if inputs else self.default_parallelism
        if not isinstance(parallelism, int) or parallelism < 1:
            raise JobDefinitionError(f"parallelism must be a positive integer, got {parallelism!r}")
        if parallelism > self.max_parallelism:
            raise JobDefinitionError(f"parallelism {parallelism} exceeds max parallelism {self.max_parallelism}")
        node = Node(len(self.nodes), kind, name or f"{kind}-{len(self.nodes)}", parallelism, payload, inputs, key_fn)
        # as Flink: an operator whose inputs are all in one group joins it, any other starts in the default one
        input_groups = {self.nodes[inp.node].slot_sharing_group for inp in inputs}
        if len(input_groups) == 1:
            node.slot_sharing_group = input_groups.pop()
        for inp in inputs:
            up = self.nodes[inp.node]
            if inp.partitioner == "forward" and up.parallelism != parallelism:
                raise JobDefinitionError(
                    f"forward from {up.name} (parallelism {up.parallelism}) to {node.name} "
                    f"(parallelism {parallelism}) needs equal parallelism; use rebalance()")
        self.nodes.append(node)
        return node

    def source(self, source: Source, *, parallelism: int | None = None, name: str | None = None,
               watermarks: BoundedOutOfOrderness | None = None) -> DataStream:
        """`watermarks`: event time for the records of this source (timestamps and watermarks, see
        runtime/api/time.py)."""
        if not isinstance(source, Source):
            raise JobDefinitionError(f"{source!r} is not a Source")
        if watermarks is not None and not isinstance(watermarks, BoundedOutOfOrderness):
            raise JobDefinitionError(f"watermarks must be a BoundedOutOfOrderness, got {watermarks!r}")
        node = self._add("source", source, parallelism, name or type(source).__name__, [])
        node.watermarks = watermarks
        return DataStream(self, node.id)

    # -- SQL (runtime/sql): statements and tables of the job's SQL session ---------------------------------------

    def sql(self, text: str) -> None:
        """Run Flink SQL statements into this job: CREATE TABLE/VIEW/FUNCTION, SET, INSERT INTO, statement sets
        (README, SQL). Raises runtime.sql.SqlError (line, column) for bad SQL, before any operator is added."""
        _sql_session(self).execute(text)

    def table(self, name: str) -> DataStream:
        """The rows (tuples) of a SQL table or view of this job as a DataStream."""
        return _sql_session(self).table(name)

    def from_stream(self, name: str, stream: DataStream, schema: Any, *, rowtime: str | None = None) -> None:
        """Make a DataStream of tuples a SQL table `name` with `schema` ('a BIGINT, t TIMESTAMP(3)'); `rowtime`
        names the column that is the records' event time (their source's watermarks come from it)."""
        _sql_session(self).from_stream(name, stream, schema, rowtime)

    @property
    def event_time(self) -> bool:
        """True when some source has watermarks: then every edge of the job carries record timestamps and
        watermarks (runtime/execution/watermarks.py)."""
        return any(n.watermarks is not None for n in self.nodes)


def _sql_session(job: Job) -> Any:
    """The job's SQL session (runtime/sql/session.py). runtime.sql plans onto this module's classes, so it is
    loaded by name, as a job module is, and the two never import each other (tests/unit/test_layering.py)."""
    return importlib.import_module("runtime.sql.session").session_of(job)


# two-input operators (runtime/api/co_functions.py); the keyed ones key both inputs
TWO_INPUT_KINDS = ("co_process", "keyed_co_process", "broadcast_process", "keyed_broadcast_process")
# operators whose context has `output(tag, value)`, and sources (records they set aside: a KafkaSource's malformed
# records with on_malformed="side-output", runtime/connectors/source.py's SideOutputBatch)
SIDE_OUTPUT_KINDS = ("source", "process", "keyed_process", *TWO_INPUT_KINDS)


class DataStream:
    """The output of one operator: chain more operators onto it, or choose how it is partitioned."""

    def __init__(self, job: Job, node_id: int, partitioner: str | None = None,
                 key_fn: Callable[[Any], Any] | None = None, tag: str | None = None) -> None:
        self.job = job
        self.node_id = node_id
        self._partitioner = partitioner
        self._key_fn = key_fn
        self._tag = tag
        self._unioned: list[DataStream] = []

    def _inputs(self, side: int = 0) -> list[Input]:
        streams = [self, *self._unioned]
        return [Input(s.node_id, s._partitioner, s._key_fn, s._tag, side) for s in streams]

    def uid(self, uid: str) -> DataStream:
        """Name the operator that produced this stream for good: its state in a checkpoint or savepoint belongs
        to this id, so a later version of the job restores it even when the operator's name, its neighbours or
        the chaining changed (README, Evolving a job). Unique within the job, non-empty. Without one, an id
        derived from the operator's position is used (runtime/graph/operator_ids.py)."""
        if not isinstance(uid, str) or not uid.strip():
            raise JobDefinitionError(f"uid must be a non-empty string, got {uid!r}")
        node = self.job.nodes[self.node_id]
        taken = next((n for n in self.job.nodes if n.uid == uid and n is not node), None)
        if taken is not None:
            raise JobDefinitionError(f"uid {uid!r} of {node.name} is already the uid of {taken.name}: uids are "
                                     "unique within a job")
        node.uid = uid
        return self

    def slot_sharing_group(self, name: str) -> DataStream:
        """Put the operator that produced this stream (and the operators after it, until another group is
        named) into slot sharing group `name`: a group's subtasks take slots of their own, so the group runs in
        other worker processes than the default group's, on other cores (in Python one process runs one core at
        a time). Operators of different groups are never chained. A job needs, per group, as many slots as the
        group's largest parallelism (Flink's `slotSharingGroup`)."""
        if not isinstance(name, str) or not name.strip():
            raise JobDefinitionError(f"slot_sharing_group must be a non-empty string, got {name!r}")
        self.job.nodes[self.node_id].slot_sharing_group = name
        return self

    def side_output(self, tag: OutputTag) -> DataStream:
        """The values this stream's operator sent to `tag` with `ctx.output(tag, value)` (late records of a
        window: `windows.LATE_DATA`; a KafkaSource's malformed records: `MALFORMED_KAFKA_RECORDS`). They travel
        on an edge of their own, never chained."""
        if not isinstance(tag, OutputTag):
            raise JobDefinitionError(f"side_output needs an OutputTag, got {tag!r}")
        node = self.job.nodes[self.node_id]
        if node.kind not in SIDE_OUTPUT_KINDS:
            raise JobDefinitionError(f"{node.name} is a {node.kind} operator, which has no side outputs")
        return DataStream(self.job, self.node_id, tag=tag.name)

    def _then(self, kind: str, payload: Any, parallelism: int | None, name: str | None,
              key_fn: Callable[[Any], Any] | None = None) -> DataStream:
        node = self.job._add(kind, payload, parallelism, name, self._inputs(), key_fn)
        return DataStream(self.job, node.id)

    def map(self, fn: Callable[[Any], Any], *, parallelism: int | None = None, name: str | None = None) -> DataStream:
        """One output per record: `fn(record)`."""
        return self._then("map", fn, parallelism, name)

    def filter(self, fn: Callable[[Any], bool], *, parallelism: int | None = None,
               name: str | None = None) -> DataStream:
        """The records for which `fn(record)` is true."""
        return self._then("filter", fn, parallelism, name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, parallelism: int | None = None,
                 name: str | None = None) -> DataStream:
        """Every item of the iterable `fn(record)`, in order."""
        return self._then("flat_map", fn, parallelism, name)

    def async_map(self, fn: AsyncFn, *, capacity: int = 100, timeout_s: float | None = 10.0, ordered: bool = True,
                  retry: RetryPolicy = NO_RETRY, parallelism: int | None = None,
                  name: str | None = None) -> DataStream:
        """One output per record: `await fn(record)`, with up to `capacity` calls in flight per subtask (README,
        Async I/O). `ordered`: outputs in input order, else as calls finish (never across a watermark). A call
        over `timeout_s` or raising is retried by `retry`; one failing for good fails the task."""
        return self._then("async_map", AsyncMap(fn, capacity, timeout_s, ordered, retry), parallelism,
                          name or "async_map", self._async_key_fn())

    def _async_key_fn(self) -> Callable[[Any], Any] | None:
        return None

    def process(self, fn: ProcessFunction, *, parallelism: int | None = None, name: str | None = None) -> DataStream:
        """A non-keyed ProcessFunction (with operator list state: `ctx.list_state`, `ctx.union_list_state`)."""
        if isinstance(fn, KeyedProcessFunction | AsyncKeyedProcessFunction):
            raise JobDefinitionError(f"a {type(fn).__name__} needs a keyed stream: call key_by() first")
        if isinstance(fn, CoProcessFunction | BroadcastProcessFunction):
            raise JobDefinitionError(f"a {type(fn).__name__} has two inputs: a.connect(b).process(fn)")
        return self._then("process", fn, parallelism, name or type(fn).__name__)

    def key_by(self, key_fn: Callable[[Any], Any], *, key_type: Any = None) -> KeyedStream:
        """Partition the stream by `key_fn(record)` (hash of the key over key groups): the next operator is
        keyed. `key_type` (optional, any value: a type, a name) declares what the key is; `connect` refuses
        two keyed streams whose declared key types differ."""
        return KeyedStream(self.job, self.node_id, "hash", key_fn, self._unioned, self._tag, key_type=key_type)

    def rebalance(self) -> DataStream:
        """Spread the records round robin over the next operator's subtasks."""
        return self._with_partitioner("rebalance")

    def forward(self) -> DataStream:
        """Subtask i sends to subtask i of the next operator (needs equal parallelism)."""
        return self._with_partitioner("forward")

    @overload
    def broadcast(self) -> DataStream: ...

    @overload
    def broadcast(self, descriptor: MapStateDescriptor, /, *more: MapStateDescriptor) -> BroadcastStream: ...

    def broadcast(self, *descriptors: MapStateDescriptor) -> DataStream | BroadcastStream:
        """Every record to every subtask of the next operator. With MapStateDescriptors: a BroadcastStream for
        the broadcast state pattern, `stream.connect(rules.broadcast(descriptor))` (runtime/api/co_functions.py)."""
        if not descriptors:
            return self._with_partitioner("broadcast")
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise JobDefinitionError(f"broadcast() takes MapStateDescriptors, got {d!r}")
        return BroadcastStream(self._with_partitioner("broadcast"), tuple(descriptors))

    def connect(self, other: DataStream | BroadcastStream) -> ConnectedStreams:
        """This stream and `other` as the two inputs of one function: `.process(CoProcessFunction)` (or, on
        `a.key_by(f).connect(b.key_by(g))`, a KeyedCoProcessFunction; on a BroadcastStream a
        BroadcastProcessFunction or KeyedBroadcastProcessFunction)."""
        if not isinstance(other, DataStream | BroadcastStream):
            raise JobDefinitionError(f"connect() takes a DataStream or a BroadcastStream, got {other!r}")
        if other.job is not self.job:
            raise JobDefinitionError("connect() needs two streams of the same job")
        return ConnectedStreams(self, other)

    def _with_partitioner(self, partitioner: str) -> DataStream:
        stream = DataStream(self.job, self.node_id, partitioner, tag=self._tag)
        stream._unioned = [s._with_partitioner(partitioner) for s in self._unioned]
        return stream

    def union(self, *others: DataStream) -> DataStream:
        """This stream and `others` as one input of the next operator (same record type)."""
        stream = DataStream(self.job, self.node_id, self._partitioner, self._key_fn, self._tag)
        stream._unioned = [*self._unioned, *others]
        return stream

    def join(self, other: DataStream) -> TwoStreams:
        """A window join: `a.join(b).where(ka).equal_to(kb).window(assigner).apply(fn)` (runtime/api/joins.py)."""
        return TwoStreams(self, other, "join")

    def co_group(self, other: DataStream) -> TwoStreams:
        """A window co-group: `a.co_group(b).where(ka).equal_to(kb).window(assigner).apply(fn)`."""
        return TwoStreams(self, other, "co_group")

    def interval_join(self, other: DataStream) -> IntervalJoin:
        """An interval join of two keyed streams: `a.key_by(f).interval_join(b.key_by(g)).between(lo, hi)
        .process(fn)` (runtime/api/interval_join.py)."""
        for which, stream in (("left", self), ("right", other)):
            if not isinstance(stream, KeyedStream):
                raise JobDefinitionError(f"interval_join: the {which} stream is not keyed; an interval join needs "
                                         "two keyed streams: a.key_by(f).interval_join(b.key_by(g))")
        if other.job is not self.job:
            raise JobDefinitionError("interval_join needs two streams of the same job")
        return IntervalJoin(self, other)  # type: ignore[arg-type]

    def sink(self, sink: Sink, *, parallelism: int | None = None, name: str | None = None) -> DataStream:
        """Write the records to `sink`; exactly once when the sink is transactional (runtime/connectors)."""
        if not isinstance(sink, Sink):
            raise JobDefinitionError(f"{sink!r} is not a Sink")
        bind_job = getattr(sink, "bind_job", None)
        if bind_job is not None:  # a transactional sink names its transactions after the job (PostgresSink)
            bind_job(self.job.name)
        return self._then("sink", sink, parallelism, name or type(sink).__name__)


class KeyedStream(DataStream):
    """A stream partitioned by key: keyed process functions, reduce and windows run on it."""

    def __init__(self, job: Job, node_id: int, partitioner: str, key_fn: Callable[[Any], Any],
                 unioned: list[DataStream], tag: str | None = None, *, key_type: Any = None) -> None:
        super().__init__(job, node_id, partitioner, key_fn, tag)
        self._unioned = [KeyedStream(job, s.node_id, partitioner, key_fn, [], s._tag) for s in unioned]
        self.key_type = key_type

    def window(self, assigner: WindowAssigner, *, allowed_lateness_ms: int = 0) -> WindowedStream:
        """Group the records of each key into windows (runtime/api/windows.py): tumbling, sliding or session
        windows, on event time or processing time; then `reduce`, `aggregate`, `count` or `process`."""
        return WindowedStream(self, assigner, allowed_lateness_ms)

    def process(self, fn: ProcessFunction | AsyncKeyedProcessFunction, *, parallelism: int | None = None,
                name: str | None = None) -> DataStream:
        """A KeyedProcessFunction, or an AsyncKeyedProcessFunction (asynchronous state: README, Asynchronous
        state)."""
        if not isinstance(fn, ProcessFunction | AsyncKeyedProcessFunction):
            raise JobDefinitionError(f"{fn!r} is not a ProcessFunction or an AsyncKeyedProcessFunction")
        return self._then("keyed_process", fn, parallelism, name or type(fn).__name__, self._key_fn)

    def _async_key_fn(self) -> Callable[[Any], Any] | None:
        # keyed async_map: a key's records are called one after the other, so per key the order is kept
        return self._key_fn

    def reduce(self, fn: Callable[[Any, Any], Any], *, parallelism: int | None = None,
               name: str | None = None) -> DataStream:
        """Emits, per record, the running reduction of all records of its key."""
        return self._then("reduce", fn, parallelism, name or "reduce", self._key_fn)


class BroadcastStream:
    """`stream.broadcast(descriptor, ...)`: a stream every subtask of the next operator receives whole, whose
    records a broadcast process function turns into broadcast state. Only `connect` takes it."""

    def __init__(self, stream: DataStream, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        self.job = stream.job
        self.stream = stream
        self.descriptors = descriptors


class ConnectedStreams:
    """`a.connect(b)`: two streams feeding one two-input function (runtime/api/co_functions.py).

    Key agreement: both sides keyed (KeyedCoProcessFunction) or neither; a keyed side beside an unkeyed one is
    refused, and so are two keyed sides whose `key_by(..., key_type=...)` declarations differ (a side that
    declares none is not checked). Records of the two sides meet in the subtask that owns their key group, so
    the two key functions must give equal keys for records that belong together."""

    def __init__(self, first: DataStream, second: DataStream | BroadcastStream) -> None:
        self.job = first.job
        self.first = first
        self.second = second

    def process(self, fn: Any, *, parallelism: int | None = None, name: str | None = None) -> DataStream:
        """Run `fn` over both inputs: records of the first go to `process1` (`process_element`), of the second
        to `process2` (`process_broadcast_element`)."""
        first, second = self.first, self.second
        label = name or type(fn).__name__
        if isinstance(second, BroadcastStream):
            kind, key_fn = self._broadcast_kind(fn, label)
            inputs = [*first._inputs(0), *second.stream._inputs(1)]
            node = self.job._add(kind, fn, parallelism, label, inputs, key_fn)
            node.broadcast_descriptors = second.descriptors
            return DataStream(self.job, node.id)
        if isinstance(fn, BroadcastProcessFunction):
            raise JobDefinitionError(
                f"{label}: a {type(fn).__name__} needs a broadcast stream with a state descriptor as the second "
                "input: stream.connect(rules.broadcast(MapStateDescriptor('rules')))" +
                (" (rules.broadcast() without a descriptor only sets the partitioning)"
                 if second._partitioner == "broadcast" else ""))
        if not isinstance(fn, CoProcessFunction):
            raise JobDefinitionError(f"{label}: connected streams run a CoProcessFunction or a "
                                     f"KeyedCoProcessFunction, got {fn!r}")
        keyed = [isinstance(s, KeyedStream) for s in (first, second)]
        if keyed[0] != keyed[1]:
            which = "first" if keyed[0] else "second"
            raise JobDefinitionError(f"{label}: the keys of the connected streams differ: only the {which} input "
                                     "is keyed; key both with key_by() (the same key on both sides) or neither")
        if isinstance(fn, KeyedCoProcessFunction) and not keyed[0]:
            raise JobDefinitionError(f"{label}: a KeyedCoProcessFunction needs keyed inputs: "
                                     "a.key_by(f).connect(b.key_by(g))")
        types = [s.key_type if isinstance(s, KeyedStream) else None for s in (first, second)]
        if None not in types and types[0] != types[1]:
            raise JobDefinitionError(f"{label}: the keys of the connected streams differ: key_type "
                                     f"{types[0]!r} on the first input, {types[1]!r} on the second")
        kind = "keyed_co_process" if isinstance(fn, KeyedCoProcessFunction) else "co_process"
        key_fn = first._key_fn if kind == "keyed_co_process" else None
        node = self.job._add(kind, fn, parallelism, label, [*first._inputs(0), *second._inputs(1)], key_fn)
        return DataStream(self.job, node.id)

    def _broadcast_kind(self, fn: Any, label: str) -> tuple[str, Callable[[Any], Any] | None]:
        keyed = isinstance(self.first, KeyedStream)
        if isinstance(fn, KeyedBroadcastProcessFunction):
            if not keyed:
                raise JobDefinitionError(f"{label}: a KeyedBroadcastProcessFunction needs a keyed main input: "
                                         "stream.key_by(f).connect(rules.broadcast(descriptor))")
            return "keyed_broadcast_process", self.first._key_fn
        if isinstance(fn, BroadcastProcessFunction):
            if keyed:
                raise JobDefinitionError(f"{label}: on a keyed main input use a KeyedBroadcastProcessFunction")
            return "broadcast_process", None
        raise JobDefinitionError(f"{label}: a stream connected to a broadcast stream runs a "
                                 f"BroadcastProcessFunction or a KeyedBroadcastProcessFunction, got {fn!r}")

