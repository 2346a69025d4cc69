"""The physical plan: logical plan nodes (runtime/sql/logical.py) -> DataStream operators of a Job.

Each plan node becomes one or a few operators, translated once however many queries read it (a table read by
two INSERTs of a statement set is one source). Every operator gets a uid derived from the plan: a hash of its
node's digest (what it computes) and its inputs' uids, so the same query run again (a savepoint restore, an
upgrade that changed only other statements) finds its state, and a changed query does not pick up state that
is not its own: the restore then reports the state no operator takes (`--allow-non-restored-state` drops it).

Rows are tuples. An updating stream carries (kind, row) pairs (runtime/sql/changelog.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from runtime.api import (
    BoundedOutOfOrderness,
    DataStream,
    EventTimeSessionWindows,
    Job,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from runtime.connectors.source import Source
from runtime.sql.connectors import make_sink, make_source
from runtime.sql.errors import SqlError
from runtime.sql.kafka_tables import ChangelogNormalizeFunction, primary_key_of, upsert_kafka_source
from runtime.sql.logical import (
    Aggregate,
    Calc,
    Correlate,
    Join,
    LookupJoin,
    OverAggregate,
    PlanNode,
    Rank,
    SetOperation,
    SinkNode,
    StreamScan,
    TableScan,
    TemporalJoin,
    Union,
    WindowAssign,
    original,
)
from runtime.sql.operators import (
    CumulativeEventTimeWindows,
    CumulativeProcessingTimeWindows,
    GroupAggregateFunction,
    OverAggregateFunction,
    RegularJoinFunction,
    RetractableTopNFunction,
    RetractingGroupAggregateFunction,
    TemporalSortFunction,
    TopNFunction,
    WatermarkCalc,
    WindowGroupAggregateFunction,
    WindowJoinFunction,
    WindowTopNFunction,
    tumble_row,
    window_output,
    window_rows,
)


@dataclass
class Operator:
    """One operator the translation added, for explain: its name, uid, parallelism, keys and state."""

    name: str
    uid: str
    parallelism: int
    keys: str = ""
    state: str = ""
    watermarks: str = ""


def rowtime_of(index: int, table: str, *, changelog: bool) -> Callable[[Any], int]:
    """The event time of a source's record: its row's rowtime column (itemgetter: the per-record path of every
    event-time query), the row of a (kind, row) pair when the table is a changelog (postgres-cdc, upsert-kafka),
    where a delete may lack it: a NULL rowtime there fails the source, as Flink's watermark assigner does."""
    if not changelog:
        return itemgetter(index)

    def of_row(row: Any) -> int:
        ts = row[index]
        if ts is None:
            raise ValueError(f"table {table}: the rowtime of a row is NULL ({row!r}); a rowtime attribute must not "
                             "be NULL (a postgres-cdc table needs REPLICA IDENTITY FULL for a delete's whole row)")
        return ts  # type: ignore[no-any-return]

    return lambda pair: of_row(pair[1])


# Flink's `pipeline.auto-watermark-interval` default: a table's source sends its watermark every 200 ms of
# wall-clock time (and when it has nothing to read), not after each row (runtime/api/time.py, emit_interval_ms)
DEFAULT_WATERMARK_INTERVAL_MS: int | None = 200


@dataclass
class Translator:
    job: Job
    parallelism: int | None = None
    # sources' periodic watermarks (SET 'pipeline.auto-watermark-interval'; None: after each row, deterministic)
    watermark_interval_ms: int | None = DEFAULT_WATERMARK_INTERVAL_MS
    streams: dict[int, DataStream] = field(default_factory=dict)
    uids: dict[int, str] = field(default_factory=dict)
    operators: dict[int, list[Operator]] = field(default_factory=dict)
    _taken: dict[str, int] = field(default_factory=dict)
    # a window aggregation's output is (key, start, end, results): the Calc above it builds its rows from that in
    # the same map, so no operator of its own turns them into (*keys, start, end, time, *results) first
    _row_builders: dict[int, Any] = field(default_factory=dict)
    # sub-plan reuse, as Flink's planner does it: a node computing what an earlier one computes (the same digest
    # over the same inputs, e.g. a subquery written twice) is that node's operators, not a copy of them
    twins: dict[int, PlanNode] = field(default_factory=dict)
    _by_digest: dict[str, PlanNode] = field(default_factory=dict)

    def translate(self, node: PlanNode) -> DataStream:
        node = original(node)
        done = self.streams.get(id(node))
        if done is not None:
            return done
        inputs = [self.translate(i) for i in node.inputs()]
        input_uids = [self.uids[id(original(i))] for i in node.inputs()]
        text = node.digest() + "|" + ",".join(input_uids)
        twin = self._by_digest.get(text)
        if twin is not None and not isinstance(node, SinkNode):  # two INSERTs into one table stay two sinks
            self.twins[id(node)] = twin
            self.streams[id(node)] = self.streams[id(twin)]
            self.uids[id(node)] = self.uids[id(twin)]
            if id(twin) in self._row_builders:
                self._row_builders[id(node)] = self._row_builders[id(twin)]
            return self.streams[id(node)]
        self._by_digest.setdefault(text, node)
        uid = self._uid(node, input_uids)
        self.uids[id(node)] = uid
        ops: list[Operator] = []
        stream = getattr(self, f"_t_{type(node).__name__}")(node, inputs, uid, ops)
        self.streams[id(node)] = stream
        self.operators[id(node)] = ops
        return stream

    def _uid(self, node: PlanNode, input_uids: list[str]) -> str:
        text = node.digest() + "|" + ",".join(input_uids)
        base = f"sql-{type(node).__name__.lower()}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        rank = self._taken.get(base, 0)
        self._taken[base] = rank + 1
        return base if rank == 0 else f"{base}-{rank}"

    def _name(self, node: PlanNode) -> str:
        digest = node.digest()
        return digest if len(digest) <= 90 else digest[:87] + "..."

    def _added(self, stream: DataStream, uid: str, ops: list[Operator], **info: str) -> DataStream:
        stream.uid(uid)
        n = self.job.nodes[stream.node_id]
        ops.append(Operator(n.name, uid, n.parallelism, **info))
        return stream

    # -- nodes -----------------------------------------------------------------------------------------------

    def _t_TableScan(self, node: TableScan, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        table = node.table
        watermarks = None
        info = ""
        if table.watermark is not None:
            assert node.rowtime is not None
            delay = table.watermark.delay_ms
            # Flink SQL's watermark is max(rowtime) - delay; BoundedOutOfOrderness emits max - max_delay - 1
            timestamp = rowtime_of(node.rowtime, table.name, changelog=not node.mode.insert_only)
            watermarks = BoundedOutOfOrderness(max(delay - 1, 0), timestamp,
                                               emit_interval_ms=self.watermark_interval_ms)
            idle = table.options.get("scan.watermark.idle-timeout")
            if idle:
                import sqlglot

                from runtime.sql.dialect import Flink
                from runtime.sql.expressions import interval_ms
                watermarks = watermarks.with_idleness(interval_ms(sqlglot.parse_one(f"INTERVAL '{idle}'",
                                                                                    read=Flink)))
            every = self.watermark_interval_ms
            info = f"{table.watermark.column} - {delay} ms, " + (f"every {every} ms" if every else "after each row")
        source: Source
        if table.connector == "upsert-kafka":  # upserts and deletes, normalized below (kafka_tables.py)
            source = upsert_kafka_source(table, node.computed)
        else:
            source = make_source(table, node.computed)
        parallelism = int(table.options["source.parallelism"]) if "source.parallelism" in table.options else None
        stream = self.job.source(source, parallelism=parallelism or self.parallelism, name=f"Source: {table.name}",
                                 watermarks=watermarks)
        stream = self._added(stream, uid, ops, watermarks=info)
        if table.connector == "upsert-kafka":  # upserts and deletes -> a changelog, per key
            normalize = stream.key_by(primary_key_of(table)).process(ChangelogNormalizeFunction(),
                                                                      name=f"ChangelogNormalize: {table.name}")
            stream = self._added(normalize, f"{uid}-normalize", ops, keys=", ".join(table.primary_key),
                                 state="per key: its last row")
        return stream

    def _t_StreamScan(self, node: StreamScan, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        return node.stream  # type: ignore[no-any-return]

    def _t_Calc(self, node: Calc, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        name = self._name(node)
        updating = not node.input.mode.insert_only
        build = None if node.reads_window_elements else self._row_builders.get(id(original(node.input)))
        if node.reads_watermark:  # one process operator: it has the watermark the expressions read
            fn = WatermarkCalc(node.predicate, node.project if node.projection is not None else None, build)
            return self._added(stream.process(fn, name=name), uid, ops)
        if node.predicate is not None:
            fn = _over_rows(node.predicate, updating, build, keep_kind=False)
            stream = self._added(stream.filter(fn, name=f"{name} (filter)"), f"{uid}-filter", ops)
        if node.projection is not None and node.project is not None:
            fn2 = _over_rows(node.project, updating, build, keep_kind=True)
            stream = self._added(stream.map(fn2, name=name), uid, ops)
        elif build is not None:
            stream = self._added(stream.map(build, name=name), uid, ops)
        return stream

    def _t_WindowAssign(self, node: WindowAssign, inputs: list[DataStream], uid: str,
                        ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        w = node.window
        name = self._name(node)
        if w.kind == "TUMBLE":
            return self._added(stream.map(tumble_row(w.size_ms, w.offset_ms, w.time_index), name=name), uid, ops)
        if w.kind == "SESSION":
            raise SqlError("a SESSION window table function is supported under a window aggregation only")
        assigner = _assigner(node)
        return self._added(stream.flat_map(window_rows(assigner.assign, w.time_index), name=name), uid, ops)

    def _t_Aggregate(self, node: Aggregate, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        assert node.key_fn is not None and node.aggregate is not None
        name = self._name(node)
        keys = ", ".join(k.sql() for k in node.keys) or "(none: one global group)"
        key_arity = len(node.keys)
        state = ", ".join(c.text for c in node.calls) or "keys"
        if node.window is not None:
            wnode = _WindowOf(node)
            windowed = stream.key_by(node.key_fn).window(_assigner(wnode)).aggregate(node.aggregate, name=name)
            self._row_builders[id(node)] = window_output(key_arity)  # the Calc above makes the rows (see there)
            return self._added(windowed, uid, ops, keys=keys, state=f"per key and window: {state}")
        if node.window_end_key is not None:
            wfn = WindowGroupAggregateFunction(node.aggregate, node.window_end_key)
            out = stream.key_by(node.key_fn).process(wfn, name=name)
            return self._added(out, uid, ops, keys=keys, state=f"per key and window, until it fires: {state}")
        if not node.input.mode.insert_only:  # (kind, row) pairs in: keyed by the row, added or retracted
            rfn = RetractingGroupAggregateFunction(node.aggregate, key_arity)
            out = stream.key_by(_of_row(node.key_fn)).process(rfn, name=name)
            return self._added(out, uid, ops, keys=keys,
                               state=f"per key: {state} with retraction (MIN/MAX: the multiset of values)")
        fn = GroupAggregateFunction(node.aggregate, key_arity)
        out = stream.key_by(node.key_fn).process(fn, name=name)
        return self._added(out, uid, ops, keys=keys, state=f"per key: {state}")

    def _t_Join(self, node: Join, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        left, right = inputs
        assert node.left_key_fn is not None and node.right_key_fn is not None
        name = self._name(node)
        keys = ", ".join(f"{a.sql()} = {b.sql()}" for a, b in zip(node.left_keys, node.right_keys, strict=True))
        left_nulls = (None,) * len(node.left.fields)
        right_nulls = (None,) * len(node.right.fields)
        if node.interval is not None:
            lower, upper = node.interval
            joined = left.key_by(node.left_key_fn).interval_join(right.key_by(node.right_key_fn)).between(lower, upper)
            joined = {"inner": joined, "left": joined.left_outer(), "right": joined.right_outer(),
                      "full": joined.full_outer()}[node.how]

            def pair(l_row: Any, r_row: Any, ctx: Any) -> None:
                ctx.emit((*(left_nulls if l_row is None else l_row), *(right_nulls if r_row is None else r_row)))
            out = self._added(joined.process(pair, name=name), uid, ops, keys=keys,
                              state=f"both sides' rows within [{lower}, {upper}] ms of the watermark")
            if node.predicate is not None:
                out = self._added(out.filter(node.predicate, name=f"{name} (where)"), f"{uid}-where", ops)
            return out
        if node.window_ends is not None:
            wfn = WindowJoinFunction(node.how, len(node.left.fields), len(node.right.fields), *node.window_ends,
                                     node.predicate)
            out = left.key_by(node.left_key_fn).connect(right.key_by(node.right_key_fn)).process(wfn, name=name)
            return self._added(out, uid, ops, keys=keys, state="both sides' rows per key and window, until it fires")
        updating_left, updating_right = not node.left.mode.insert_only, not node.right.mode.insert_only
        fn = RegularJoinFunction(node.how, len(node.left.fields), len(node.right.fields), node.predicate,
                                 node.ttl_ms, updating_left=updating_left, updating_right=updating_right)
        left_key = _of_row(node.left_key_fn) if updating_left else node.left_key_fn
        right_key = _of_row(node.right_key_fn) if updating_right else node.right_key_fn
        out = left.key_by(left_key).connect(right.key_by(right_key)).process(fn, name=name)
        ttl = f" (expiring after {node.ttl_ms} ms)" if node.ttl_ms else " (kept forever: SET 'table.exec.state.ttl')"
        return self._added(out, uid, ops, keys=keys, state=f"both sides' rows per key{ttl}")

    def _t_Rank(self, node: Rank, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        assert node.key_fn is not None and node.sort_key is not None
        if node.window_end is not None:
            wfn = WindowTopNFunction(node.limit, node.sort_key, node.window_end, node.with_rank, node.newest_wins_ties)
            out = stream.key_by(node.key_fn).process(wfn, name=self._name(node))
            return self._added(out, uid, ops, keys=", ".join(p.sql() for p in node.partition),
                               state=f"the top {node.limit} rows per key and window, until it fires")
        partition = ", ".join(p.sql() for p in node.partition) or "(one partition)"
        if node.limit == 0:
            assert node.rowtime is not None
            sfn = TemporalSortFunction(node.rowtime, node.sort_key)
            out = stream.key_by(node.key_fn).process(sfn, name=self._name(node))
            return self._added(out, uid, ops, keys=partition, state="rows until the watermark passes them")
        if not node.input.mode.insert_only:
            rfn = RetractableTopNFunction(node.limit, node.sort_key, node.with_rank, offset=node.offset)
            out = stream.key_by(_of_row(node.key_fn)).process(rfn, name=self._name(node))
            return self._added(out, uid, ops, keys=partition, state="every row per key (the top "
                               f"{node.limit} emitted; a retracted one lets the next in)")
        fn = TopNFunction(node.limit, node.sort_key, node.with_rank, node.mode.insert_only, node.newest_wins_ties,
                          offset=node.offset)
        out = stream.key_by(node.key_fn).process(fn, name=self._name(node))
        return self._added(out, uid, ops, keys=", ".join(p.sql() for p in node.partition) or "(one partition)",
                           state=f"the top {node.limit} rows per key")

    def _t_Correlate(self, node: Correlate, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        assert node.rows_fn is not None
        build = self._row_builders.get(id(original(node.input)))  # a window operator's output: its rows first
        rows = node.rows_fn if build is None else (lambda e, f=node.rows_fn: f(build(e)))
        return self._added(stream.flat_map(rows, name=self._name(node)), uid, ops)

    def _t_OverAggregate(self, node: OverAggregate, inputs: list[DataStream], uid: str,
                         ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        assert node.key_fn is not None and node.aggregate is not None and node.rowtime is not None
        fn = OverAggregateFunction(node.aggregate, rows=node.rows, preceding=node.preceding, time_index=node.rowtime)
        out = stream.key_by(node.key_fn).process(fn, name=self._name(node))
        frame = "rows" if node.rows else "rows of the range"
        return self._added(out, uid, ops, keys=", ".join(p.sql() for p in node.partition) or "(one partition)",
                           state=f"rows until the watermark passes them, the frame's {frame}")

    def _t_LookupJoin(self, node: LookupJoin, inputs: list[DataStream], uid: str, ops: list[Operator]
                      ) -> DataStream:
        """async_map of the lookup (the runtime's async I/O: lookups in flight, retries, the in-flight rows in
        the checkpoint), then the joined rows flattened: none (inner, no match), one, or one per matching row."""
        from runtime.api import RetryPolicy
        from runtime.sql.postgres_tables import LookupFunction

        (stream,) = inputs
        assert node.left_key_fn is not None
        key_fn = node.left_key_fn
        single = len(node.lookup_columns) == 1
        lookup = LookupFunction(node.table, node.lookup_columns, (lambda row: (key_fn(row),)) if single else key_fn,
                                left=node.how == "left", filter_fn=node.predicate,
                                updating=not node.input.mode.insert_only)
        retry = RetryPolicy(max_attempts=lookup.settings.max_retries + 1)
        looked_up = stream.async_map(lookup, capacity=lookup.settings.capacity, timeout_s=30.0, ordered=True,
                                     retry=retry, name=self._name(node))
        cache = (f", cache: {lookup.settings.cache_rows} rows" if lookup.settings.cache_rows else
                 f", the whole table, reloaded every {lookup.settings.full_reload_ms} ms"
                 if lookup.settings.full_reload_ms else "")
        self._added(looked_up, uid, ops, keys=", ".join(node.lookup_columns),
                    state=f"the lookups in flight{cache}")
        flat = looked_up.flat_map(_identity, name=f"{self._name(node)} rows")
        return self._added(flat, f"{uid}-rows", ops)

    def _t_TemporalJoin(self, node: TemporalJoin, inputs: list[DataStream], uid: str, ops: list[Operator]
                        ) -> DataStream:
        from runtime.sql.temporal_join import TemporalJoinFunction

        left, right = inputs
        assert node.left_key_fn is not None and node.right_key_fn is not None
        assert node.left.rowtime is not None and node.right.rowtime is not None
        changelog = not node.right.mode.insert_only
        fn = TemporalJoinFunction(node.how, len(node.right.fields), node.left.rowtime, node.right.rowtime,
                                  node.predicate, right_changelog=changelog, right_deletes=node.right_deletes)
        right_key = _of_row(node.right_key_fn) if changelog else node.right_key_fn
        out = left.key_by(node.left_key_fn).connect(right.key_by(right_key)).process(fn, name=self._name(node))
        keys = ", ".join(f"{a.sql()} = {b.sql()}" for a, b in zip(node.left_keys, node.right_keys, strict=True))
        return self._added(out, uid, ops, keys=keys, state="left rows until the watermark passes them; per key "
                           "the versions from the one valid at the watermark on")

    def _t_Union(self, node: Union, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        first, *rest = inputs
        return first.union(*rest)

    def _t_SetOperation(self, node: SetOperation, inputs: list[DataStream], uid: str, ops: list[Operator]
                        ) -> DataStream:
        from runtime.sql.set_operations import SetOperationFunction, signed_rows

        sides = []
        for i, (side, stream) in enumerate(zip(node.inputs(), inputs, strict=True)):
            tag = signed_rows(i == 0, updating=not side.mode.insert_only)
            sides.append(self._added(stream.map(tag, name=f"{self._name(node)} ({('left', 'right')[i]})"),
                                     f"{uid}-{('left', 'right')[i]}", ops))
        fn = SetOperationFunction(node.kind, every=node.every)
        out = sides[0].union(sides[1]).key_by(_set_row_key).process(fn, name=self._name(node))
        return self._added(out, uid, ops, keys="every column", state="per row: its count on each side")

    def _t_SinkNode(self, node: SinkNode, inputs: list[DataStream], uid: str, ops: list[Operator]) -> DataStream:
        (stream,) = inputs
        changelog = not node.mode.insert_only
        if node.convert is not None:
            convert = node.convert
            fn = (lambda e: (e[0], convert(e[1]))) if changelog else convert
            stream = self._added(stream.map(fn, name=f"Sink cast: {node.table.name}"), f"{uid}-cast", ops)
        sink = make_sink(node.table, changelog=changelog)
        return self._added(stream.sink(sink, name=f"Sink: {node.table.name}"), uid, ops)


def _identity(rows: Any) -> Any:
    return rows


def _set_row_key(e: Any) -> Any:
    """The key of a set operation's (from the left, sign, row) triples: the whole row."""
    return e[2]


def _of_row(key_fn: Any) -> Any:
    """A key function of rows, applied to the (kind, row) pairs of an updating stream."""
    return lambda e: key_fn(e[1])


def _over_rows(fn: Any, updating: bool, build: Any, *, keep_kind: bool) -> Any:
    """`fn` of a row, applied to what the stream carries: a row, a (kind, row) pair (a projection keeps the
    kind), or a window operator's (key, start, end, results) that `build` makes the row of."""
    if build is not None:
        return lambda e: fn(build(e))
    if not updating:
        return fn
    if keep_kind:
        return lambda e: (e[0], fn(e[1]))
    return lambda e: fn(e[1])


@dataclass
class _WindowOf:
    window: Any

    def __init__(self, node: Aggregate) -> None:
        self.window = node.window


def _assigner(node: Any) -> Any:
    """The runtime's window assigner of a window TVF: event time over a rowtime, the wall clock over PROCTIME()."""
    w = node.window
    if w.kind == "TUMBLE":
        tumbling = TumblingProcessingTimeWindows if w.proctime else TumblingEventTimeWindows
        return tumbling(w.size_ms, w.offset_ms % w.size_ms)
    if w.kind == "HOP":
        sliding = SlidingProcessingTimeWindows if w.proctime else SlidingEventTimeWindows
        return sliding(w.size_ms, w.slide_ms, w.offset_ms % w.slide_ms)
    if w.kind == "CUMULATE":
        cumulative = CumulativeProcessingTimeWindows if w.proctime else CumulativeEventTimeWindows
        return cumulative(w.slide_ms, w.size_ms, w.offset_ms)
    return ProcessingTimeSessionWindows(w.gap_ms) if w.proctime else EventTimeSessionWindows(w.gap_ms)
