"""The logical plan: a query (sqlglot tree) -> a tree of typed plan nodes, each with its fields, changelog mode
and rowtime. Expressions are compiled here, once (runtime/sql/expressions.py); runtime/sql/physical.py turns
the nodes into DataStream operators and runtime/sql/explain.py prints them.

What is planned (Flink's streaming semantics):
- FROM a table, a view, a subquery, or a window table function TABLE(TUMBLE|HOP|CUMULATE|SESSION(...));
- WHERE and the SELECT list as one Calc (filter, then projection);
- GROUP BY window_start, window_end [, keys] over a window TVF: a window aggregation, insert-only, emitted when
  the watermark passes the window's end;
- any other GROUP BY (or aggregates without one): an unbounded group aggregation, an updating changelog; over
  an updating input it retracts too (runtime/sql/retracting.py) and deletes a group whose rows are all retracted;
- HAVING after either; UNION ALL of inputs with the same column types; UNION and SELECT DISTINCT as a
  GroupAggregate over the whole row; WITH's queries planned once and read by name;
- a GROUP BY of the window_start and window_end of a window aggregation's rows: a window aggregation again;
- ROW_NUMBER() OVER (...) <= N in the outer WHERE: Top-N (retractable over an updating input), or a window
  Top-N when the partition holds the window;
- joins: a window join when both sides are windows joined on their bounds, an interval join when the condition
  bounds their rowtimes, else a regular join;
- aggregates OVER (PARTITION BY .. ORDER BY rowtime frame): a row-time OverAggregate, then the SELECT list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlglot import exp

from runtime.sql import types as T
from runtime.sql.aggregates import AggregateCall, CompiledAggregate, describe_call, find_aggregates
from runtime.sql.catalog import Catalog, TableDef
from runtime.sql.changelog import ALL, INSERT_ONLY, RETRACTING, UPDATING, ChangelogMode, require_insert_only
from runtime.sql.dialect import Descriptor, TableArgument, WindowTableFunction
from runtime.sql.errors import SqlError
from runtime.sql.expressions import AGGREGATES, ExpressionCompiler, Field, Scope, interval_ms, position
from runtime.sql.join_conditions import conjuncts, side_of
from runtime.sql.join_conditions import split as split_condition
from runtime.sql.metadata import readable, writable
from runtime.sql.retracting import RetractingAggregate

WINDOW_COLUMNS = ("window_start", "window_end", "window_time")


@dataclass(frozen=True)
class WindowColumns:
    """Where a window TVF's or a window aggregation's window_start and window_end are in a node's rows (through
    projections that keep both, renamed or not): Flink's window properties, which a window Top-N, a window join
    and a GROUP BY of the windows key on."""

    start: int
    end: int


@dataclass(eq=False)
class PlanNode:
    fields: tuple[Field, ...]
    mode: ChangelogMode
    rowtime: int | None  # the field equal to every row's event timestamp (a time attribute), if any
    windowed: WindowColumns | None = None  # the window's bounds, on the rows of a window TVF or aggregation

    def inputs(self) -> list[PlanNode]:
        return []

    def digest(self) -> str:
        """What the operator does, in Flink's explain style; with its inputs' digests it names its state (uid)."""
        raise NotImplementedError

    @property
    def scope(self) -> Scope:
        return Scope(self.fields)


@dataclass(eq=False)
class TableScan(PlanNode):
    table: TableDef = None  # type: ignore[assignment]
    computed: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
    computed_source: str = ""

    def digest(self) -> str:
        wm = self.table.watermark
        watermark = f", watermark=[{wm.column} - {wm.delay_ms}ms]" if wm else ""
        return f"TableSourceScan(table=[{self.table.name}], fields=[{', '.join(f.name for f in self.fields)}]" \
               f"{watermark})"


@dataclass(eq=False)
class StreamScan(PlanNode):
    """A DataStream of rows registered with `job.from_stream(stream, schema)`."""

    name: str = ""
    stream: Any = None

    def digest(self) -> str:
        return f"DataStreamScan(table=[{self.name}], fields=[{', '.join(f.name for f in self.fields)}])"


@dataclass(eq=False)
class Calc(PlanNode):
    input: PlanNode = None  # type: ignore[assignment]
    projection: list[exp.Expr] | None = None
    condition: exp.Expr | None = None
    project: Callable[[Any], tuple[Any, ...]] | None = None
    predicate: Callable[[Any], Any] | None = None
    source: str = ""
    reads_window_elements: bool = False  # over a window aggregation: compiled over its (key, start, end, results)
    reads_watermark: bool = False  # CURRENT_WATERMARK: compiled as functions of (row, _wm), the watermark

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        parts = []
        if self.projection is not None:
            parts.append("select=[" + ", ".join(_named(e, f.name) for e, f in zip(self.projection, self.fields,
                                                                                   strict=True)) + "]")
        if self.condition is not None:
            parts.append(f"where=[{self.condition.sql()}]")
        return f"Calc({', '.join(parts)})"


@dataclass(frozen=True)
class WindowSpec:
    """A window table function: `kind` TUMBLE|HOP|CUMULATE|SESSION over the rowtime field `time_index`."""

    kind: str
    time_index: int
    time_name: str
    size_ms: int = 0
    slide_ms: int = 0  # HOP's slide, CUMULATE's step
    gap_ms: int = 0  # SESSION
    offset_ms: int = 0
    partition: tuple[str, ...] = ()
    proctime: bool = False  # over a PROCTIME() column: windows of the operator's wall clock, fired by it

    def __str__(self) -> str:
        ms = {"TUMBLE": f"size=[{self.size_ms} ms]", "HOP": f"slide=[{self.slide_ms} ms], size=[{self.size_ms} ms]",
              "CUMULATE": f"step=[{self.slide_ms} ms], max_size=[{self.size_ms} ms]",
              "SESSION": f"gap=[{self.gap_ms} ms]"}[self.kind]
        part = f", partition keys=[{', '.join(self.partition)}]" if self.partition else ""
        return f"{self.kind}(time_col=[{self.time_name}], {ms}{part})"


@dataclass(eq=False)
class WindowAssign(PlanNode):
    """A window TVF's rows: every input row once per window it is in, with window_start, window_end,
    window_time appended."""

    input: PlanNode = None  # type: ignore[assignment]
    window: WindowSpec = None  # type: ignore[assignment]

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        return f"WindowTableFunction(window=[{self.window}])"


@dataclass(eq=False)
class Aggregate(PlanNode):
    """GROUP BY: `keys` over the input, aggregate `calls` in one accumulator; output rows are
    (*keys, [window_start, window_end, window_time,] *results)."""

    input: PlanNode = None  # type: ignore[assignment]
    keys: list[exp.Expr] = field(default_factory=list)
    key_fn: Callable[[Any], Any] | None = None
    key_source: str = ""
    calls: list[AggregateCall] = field(default_factory=list)
    aggregate: CompiledAggregate | None = None
    window: WindowSpec | None = None
    window_end_key: int | None = None  # grouped by its input's windows: the key holding window_end

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        keys = ", ".join(k.sql() for k in self.keys)
        # a DISTINCT shows its keys as Flink does (a window aggregation's digest, and so its uid, stays as it was)
        select = ", ".join(c.text for c in self.calls) if self.calls or self.window is not None else keys
        if self.window is not None:
            return f"WindowAggregate(groupBy=[{keys}], window=[{self.window}], select=[{select}])"
        if self.window_end_key is not None:
            return f"WindowAggregate(groupBy=[{keys}], window=[the input's windows], select=[{select}])"
        return f"GroupAggregate(groupBy=[{keys}], select=[{select}])"


@dataclass(eq=False)
class Join(PlanNode):
    """An equi-join of two inputs: an interval join when the condition bounds the distance of their rowtimes
    (`interval` = (lower, upper) on right_time - left_time), else a regular join keeping both sides in state.
    Output rows are the left row's fields then the right row's."""

    left: PlanNode = None  # type: ignore[assignment]
    right: PlanNode = None  # type: ignore[assignment]
    how: str = "inner"
    left_keys: list[exp.Expr] = field(default_factory=list)
    right_keys: list[exp.Expr] = field(default_factory=list)
    left_key_fn: Callable[[Any], Any] | None = None
    right_key_fn: Callable[[Any], Any] | None = None
    interval: tuple[int, int] | None = None
    condition: exp.Expr | None = None  # the rest of the ON condition, checked per joined pair
    predicate: Callable[[Any], Any] | None = None
    ttl_ms: int | None = None
    window_ends: tuple[int, int] | None = None  # a window join: the window_end field of the left and right rows

    def inputs(self) -> list[PlanNode]:
        return [self.left, self.right]

    def digest(self) -> str:
        kind = {"inner": "InnerJoin", "left": "LeftOuterJoin", "right": "RightOuterJoin",
                "full": "FullOuterJoin"}[self.how]
        keys = " AND ".join(f"{a.sql()} = {b.sql()}" for a, b in zip(self.left_keys, self.right_keys, strict=True))
        extra = f" AND {self.condition.sql()}" if self.condition is not None else ""
        if self.interval is not None:
            lo, hi = self.interval
            return f"IntervalJoin(joinType=[{kind}], where=[{keys}{extra}], " \
                   f"bounds=[right.rowtime - left.rowtime in [{lo}, {hi}] ms])"
        if self.window_ends is not None:
            return f"WindowJoin(joinType=[{kind}], where=[{keys}{extra}])"
        ttl = f", stateTtl=[{self.ttl_ms} ms]" if self.ttl_ms else ""
        return f"Join(joinType=[{kind}], where=[{keys}{extra}]{ttl})"


@dataclass(eq=False)
class LookupJoin(PlanNode):
    """`JOIN dim FOR SYSTEM_TIME AS OF left.proc_time AS d ON left.k = d.id`: each row of the input looks its key
    up in a jdbc table (runtime/sql/postgres_tables.py, through async I/O); output rows are the input row's
    fields then the dimension row's. Insert-only over an insert-only input."""

    input: PlanNode = None  # type: ignore[assignment]
    table: TableDef = None  # type: ignore[assignment]
    how: str = "inner"
    left_keys: list[exp.Expr] = field(default_factory=list)
    lookup_columns: tuple[str, ...] = ()
    left_key_fn: Callable[[Any], Any] | None = None
    condition: exp.Expr | None = None  # the rest of the ON condition, checked per joined pair
    predicate: Callable[[Any], Any] | None = None

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        kind = {"inner": "InnerJoin", "left": "LeftOuterJoin"}[self.how]
        keys = ", ".join(f"{c}={k.sql()}" for c, k in zip(self.lookup_columns, self.left_keys, strict=True))
        extra = f", where=[{self.condition.sql()}]" if self.condition is not None else ""
        return f"LookupJoin(table=[{self.table.qualified()}], joinType=[{kind}], lookup=[{keys}]{extra})"


@dataclass(eq=False)
class Correlate(PlanNode):
    """`t, LATERAL TABLE(f(args)) AS T(c1, ...)` (or CROSS JOIN, or LEFT JOIN ... ON TRUE): Flink's Correlate,
    each input row joined with every row the Python table function yields for it; LEFT: a row it yields none for
    goes out once, padded with NULLs. Insert-only over an insert-only input; no state."""

    input: PlanNode = None  # type: ignore[assignment]
    call: exp.Expr = None  # type: ignore[assignment]
    how: str = "inner"
    rows_fn: Callable[[Any], list[Any]] | None = None  # an input row -> the output rows

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        kind = {"inner": "INNER", "left": "LEFT"}[self.how]
        return f"Correlate(invocation=[{self.call.sql()}], joinType=[{kind}])"


@dataclass(eq=False)
class TemporalJoin(PlanNode):
    """`JOIN r FOR SYSTEM_TIME AS OF left.rowtime ON left.k = r.pk`: each left row joined, once the watermark
    passes it, with the version of r valid at its rowtime (runtime/sql/temporal_join.py). Output rows are the
    left row's fields then the right row's; insert-only, the left rowtime kept."""

    left: PlanNode = None  # type: ignore[assignment]
    right: PlanNode = None  # type: ignore[assignment]
    how: str = "inner"
    left_keys: list[exp.Expr] = field(default_factory=list)
    right_keys: list[exp.Expr] = field(default_factory=list)
    left_key_fn: Callable[[Any], Any] | None = None
    right_key_fn: Callable[[Any], Any] | None = None
    condition: exp.Expr | None = None  # the rest of the ON condition, checked per joined pair
    predicate: Callable[[Any], Any] | None = None
    right_deletes: bool = True  # a -D of the right side deletes its key (False: a deduplication's, a replacement)

    def inputs(self) -> list[PlanNode]:
        return [self.left, self.right]

    def digest(self) -> str:
        kind = {"inner": "InnerJoin", "left": "LeftOuterJoin"}[self.how]
        keys = " AND ".join(f"{a.sql()} = {b.sql()}" for a, b in zip(self.left_keys, self.right_keys, strict=True))
        extra = f" AND {self.condition.sql()}" if self.condition is not None else ""
        assert self.rowtime is not None and self.right.rowtime is not None
        return f"TemporalJoin(joinType=[{kind}], where=[__TEMPORAL_JOIN_CONDITION({self.fields[self.rowtime].name}, " \
               f"{self.right.fields[self.right.rowtime].name}) AND {keys}{extra}])"


@dataclass(eq=False)
class Rank(PlanNode):
    """ROW_NUMBER() OVER (PARTITION BY keys ORDER BY ...) <= limit: Top-N, or deduplication when limit is 1;
    ORDER BY ... LIMIT n (no partition); LIMIT n alone (no order: the first rows); limit 0: ORDER BY the rowtime
    alone, a sort on a time attribute."""

    input: PlanNode = None  # type: ignore[assignment]
    partition: list[exp.Expr] = field(default_factory=list)
    order: list[exp.Ordered] = field(default_factory=list)
    limit: int = 1  # the last rank kept (OFFSET m LIMIT n: m + n)
    offset: int = 0  # OFFSET m: ranks m+1..limit are the output
    with_rank: bool = False
    key_fn: Callable[[Any], Any] | None = None
    sort_key: Callable[[Any], Any] | None = None
    newest_wins_ties: bool = False
    window_end: int | None = None  # a window Top-N: the field of the window's end, emitted when it fires
    deduplicates: bool = False  # N = 1 ordered by one timestamp: keep the first row (or the last, DESC)

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        if self.limit == 0:  # ORDER BY the rowtime without LIMIT
            return f"TemporalSort(orderBy=[{', '.join(o.sql() for o in self.order)}])"
        if not self.order and self.window_end is None:  # LIMIT without ORDER BY
            return f"Limit(offset=[{self.offset}], fetch=[{self.limit - self.offset}])"
        name = "Deduplicate" if self.limit == 1 else "Rank"
        if self.window_end is not None:
            name = "WindowDeduplicate" if self.deduplicates else "WindowRank"
        order = ", ".join(o.sql() for o in self.order)
        return f"{name}(partitionBy=[{', '.join(p.sql() for p in self.partition)}], orderBy=[{order}], " \
               f"rankRange=[{self.offset + 1}..{self.limit}], outputRank=[{str(self.with_rank).lower()}])"


@dataclass(eq=False)
class OverAggregate(PlanNode):
    """Aggregates OVER (PARTITION BY keys ORDER BY rowtime ROWS|RANGE BETWEEN n PRECEDING AND CURRENT ROW): each
    input row with its frame's `calls` appended (`preceding` rows or ms; None: UNBOUNDED)."""

    input: PlanNode = None  # type: ignore[assignment]
    partition: list[exp.Expr] = field(default_factory=list)
    key_fn: Callable[[Any], Any] | None = None
    calls: list[AggregateCall] = field(default_factory=list)
    aggregate: CompiledAggregate | None = None
    rows: bool = False
    preceding: int | None = None

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        assert self.rowtime is not None
        start = "UNBOUNDED" if self.preceding is None else f"{self.preceding}{'' if self.rows else ' ms'}"
        frame = f"{'ROWS' if self.rows else 'RANGE'} BETWEEN {start} PRECEDING AND CURRENT ROW"
        return f"OverAggregate(partitionBy=[{', '.join(p.sql() for p in self.partition)}], " \
               f"orderBy=[{self.fields[self.rowtime].name} ASC], window=[{frame}], " \
               f"select=[{', '.join(c.text for c in self.calls)}])"


@dataclass(eq=False)
class Union(PlanNode):
    branches: list[PlanNode] = field(default_factory=list)

    def inputs(self) -> list[PlanNode]:
        return list(self.branches)

    def digest(self) -> str:
        return f"Union(all=[true], fields=[{', '.join(f.name for f in self.fields)}])"


@dataclass(eq=False)
class SetOperation(PlanNode):
    """INTERSECT or EXCEPT (`every`: the ALL form) of two inputs with rows of one shape."""

    left: PlanNode = None  # type: ignore[assignment]
    right: PlanNode = None  # type: ignore[assignment]
    kind: str = "INTERSECT"
    every: bool = False

    def inputs(self) -> list[PlanNode]:
        return [self.left, self.right]

    def digest(self) -> str:
        names = ", ".join(f.name for f in self.fields)
        return f"{self.kind.title()}(all=[{str(self.every).lower()}], fields=[{names}])"


@dataclass(eq=False)
class SinkNode(PlanNode):
    input: PlanNode = None  # type: ignore[assignment]
    table: TableDef = None  # type: ignore[assignment]
    convert: Callable[[Any], Any] | None = None  # row of the query -> row of the table (casts), None: as is

    def inputs(self) -> list[PlanNode]:
        return [self.input]

    def digest(self) -> str:
        return f"Sink(table=[{self.table.qualified()}], fields=[{', '.join(f.name for f in self.fields)}])"


def _named(node: exp.Expr, name: str) -> str:
    text = node.unalias().sql()
    return text if text == name else f"{text} AS {name}"


def _field_name(node: exp.Expr, position: int) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    return f"EXPR${position}"


class Planner:
    """Plans queries against a catalog (module docstring). `streams` are the tables registered from DataStreams."""

    def __init__(self, catalog: Catalog, streams: dict[str, StreamScan] | None = None) -> None:
        self.catalog = catalog
        self.streams = streams if streams is not None else {}
        self._scans: dict[str, TableScan] = {}  # one source per table, shared by every query of the job
        self._ctes: dict[str, PlanNode] = {}  # the WITH queries in scope while planning a query

    # -- statements ------------------------------------------------------------------------------------------

    def plan_insert(self, insert: exp.Insert) -> SinkNode:
        target = insert.this
        name = target.this.name if isinstance(target, exp.Schema) else target.name
        table = self.catalog.table(name)
        body = insert.expression
        if insert.args.get("with_") is not None:  # WITH ... INSERT INTO t SELECT: the CTEs belong to the query
            body = body.copy()
            body.set("with_", insert.args["with_"])
        query = self.plan_query(body)
        writable(table)  # a persisted metadata column the connector cannot write is refused (declare it VIRTUAL)
        physical = table.persisted
        columns = target.expressions if isinstance(target, exp.Schema) else None
        if columns:  # INSERT INTO t (a, b) SELECT ...: reorder, the others NULL
            positions = [next((i for i, c in enumerate(physical) if c.name == col.name), None) for col in columns]
            missing = [c.name for c, p in zip(columns, positions, strict=True) if p is None]
            if missing:
                raise SqlError(f"Unknown target column '{missing[0]}' of table {name}")
            if len(columns) != len(query.fields):
                raise SqlError(f"INSERT INTO {name}: {len(columns)} target columns, {len(query.fields)} query columns")
            order = {p: i for i, p in enumerate(positions)}
            pick = [order.get(i) for i in range(len(physical))]

            def reorder_row(row: Any) -> Any:
                return tuple(None if i is None else row[i] for i in pick)
            reorder: Callable[[Any], Any] | None = reorder_row
            produced = [query.fields[order[i]].type if i in order else T.NULL for i in range(len(physical))]
        else:
            if len(query.fields) != len(physical):
                raise SqlError(
                    f"Column types of query result and sink for 'default_catalog.default_database.{name}' do not "
                    f"match: the query has {len(query.fields)} columns ({', '.join(f.name for f in query.fields)}), "
                    f"the sink {len(physical)} ({', '.join(c.name for c in physical)})")
            reorder = None
            produced = [f.type for f in query.fields]
        convert = _sink_casts(table, produced, reorder)
        fields = tuple(Field(c.name, c.type) for c in physical)  # type: ignore[arg-type]
        return SinkNode(fields, query.mode, None, input=query, table=table, convert=convert)

    def plan_query(self, query: exp.Expr) -> PlanNode:
        if isinstance(query, exp.Subquery):
            return self.plan_query(query.this)
        if query.args.get("with_") is not None:
            return self._with(query)
        if isinstance(query, exp.Union):
            left, right = self.plan_query(query.this), self.plan_query(query.expression)
            union = self._union([left, right])
            # UNION (distinct) is Flink's Union(all) and a GroupAggregate over every column
            return self._distinct(union) if query.args.get("distinct") else union
        if isinstance(query, exp.Intersect | exp.Except):
            return self._set_operation(query)
        if isinstance(query, exp.Select):
            return self._select(query)
        raise SqlError(f"{type(query).__name__} is not supported as a query: {query.sql()[:60]}")

    def _with(self, query: exp.Expr) -> PlanNode:
        """WITH a AS (...), b (x, y) AS (...) <query>: each CTE planned once, in order (a later one may read an
        earlier one), visible by name in the query only; a CTE read twice is one operator, as a table is."""
        with_ = query.args["with_"]
        if with_.args.get("recursive"):
            raise SqlError("WITH RECURSIVE is not supported")
        saved = dict(self._ctes)
        try:
            for cte in with_.expressions:
                planned = self.plan_query(cte.this)
                columns = [c.name for c in cte.args["alias"].columns] if cte.args.get("alias") else []
                if columns:
                    if len(columns) != len(planned.fields):
                        raise SqlError(f"WITH {cte.alias} ({', '.join(columns)}): {len(columns)} column names for "
                                       f"a query of {len(planned.fields)} columns")
                    planned = _requalified(planned, tuple(Field(c, f.type) for c, f in zip(columns, planned.fields,
                                                                                            strict=True)))
                self._ctes[cte.alias] = planned
            body = query.copy()
            body.set("with_", None)
            return self.plan_query(body)
        finally:
            self._ctes = saved

    def _distinct(self, node: PlanNode) -> PlanNode:
        """SELECT DISTINCT / UNION: Flink's GroupAggregate keyed by the whole row with no aggregate calls; it
        emits a row the first time it is seen (+I) and nothing after. Its changelog is updating ([I,UB,UA], as
        Flink infers it for every GroupAggregate), so an append-only sink refuses it as Flink does."""
        compiler = ExpressionCompiler(node.scope, self.catalog.functions)
        width = len(node.fields)
        key_source = "lambda r: r[0]" if width == 1 else "lambda r: tuple(r)"
        keys: list[exp.Expr] = [exp.column(f.name) for f in node.fields]
        # over an updating input: a row is deleted (-D) when its last copy is retracted
        updating_input = not node.mode.insert_only
        aggregate: Any = RetractingAggregate([], compiler) if updating_input else CompiledAggregate([], compiler)
        fields = tuple(Field(f.name, f.type) for f in node.fields)
        return Aggregate(fields, ALL if updating_input else UPDATING, None, input=node, keys=keys,
                         key_fn=compiler.build(key_source), key_source=key_source, calls=[], aggregate=aggregate)

    def _set_operation(self, query: exp.Intersect | exp.Except) -> PlanNode:
        """INTERSECT / EXCEPT [ALL], as Flink plans them: both sides keyed by the whole row, a count per side
        (runtime/sql/set_operations.py); the output is updating (+I, -D) as the counts change."""
        kind = "INTERSECT" if isinstance(query, exp.Intersect) else "EXCEPT"
        every = not query.args.get("distinct")
        left, right = self.plan_query(query.this), self.plan_query(query.expression)
        if len(left.fields) != len(right.fields):
            raise SqlError(f"{kind} of {len(left.fields)} and {len(right.fields)} columns")
        fields = tuple(Field(f.name, _union_type([f.type, g.type])) for f, g in zip(left.fields, right.fields,
                                                                                      strict=True))
        return SetOperation(fields, RETRACTING, None, left=left, right=right, kind=kind, every=every)

    def _union(self, branches: list[PlanNode]) -> PlanNode:
        flat: list[PlanNode] = []
        for b in branches:
            flat += b.branches if isinstance(b, Union) else [b]
        width = len(flat[0].fields)
        for b in flat[1:]:
            if len(b.fields) != width:
                raise SqlError(f"UNION ALL of {width} and {len(b.fields)} columns")
        fields = tuple(Field(f.name, _union_type([b.fields[i].type for b in flat]))
                       for i, f in enumerate(flat[0].fields))
        mode = INSERT_ONLY if all(b.mode.insert_only for b in flat) else UPDATING
        rowtime = flat[0].rowtime if all(b.rowtime == flat[0].rowtime for b in flat) else None
        return Union(fields, mode, rowtime, branches=flat)

    # -- SELECT ----------------------------------------------------------------------------------------------

    def _select(self, select: exp.Select) -> PlanNode:
        if select.args.get("offset") and not select.args.get("limit"):
            raise SqlError("OFFSET without LIMIT (or FETCH) is not supported yet in Sluice SQL: a streaming query's "
                           "rows after the first m would be every row kept in state")
        if select.args.get("order") and select.args.get("limit"):
            return self._order_limit(select)
        if select.args.get("order") and not select.args.get("limit") and not select.args.get("qualify"):
            return self._temporal_sort(select)
        if select.args.get("limit") and not select.args.get("qualify"):
            return self._limit(select)
        for unsupported in ("order", "limit", "qualify"):
            if select.args.get(unsupported):
                what = {"order": "ORDER BY", "limit": "LIMIT", "qualify": "QUALIFY"}[unsupported]
                raise SqlError(f"{what} is not supported yet in Sluice SQL (README, SQL: what is not yet)")
        distinct = select.args.get("distinct")
        if distinct is not None:
            if distinct.args.get("on"):
                raise SqlError("SELECT DISTINCT ON is not Flink SQL: use ROW_NUMBER() OVER (PARTITION BY ...) = 1")
            plain = select.copy()
            plain.set("distinct", None)
            return self._distinct(self._select(plain))
        where = select.args.get("where")
        ranked = self._top_n(select.args.get("from_"), where.this if where else None)
        if ranked is not None:
            source, rest = ranked
            where = exp.Where(this=exp.and_(*rest)) if rest else None
        else:
            source = self._from(select.args.get("from_"))
        if select.args.get("joins"):
            source, rest = self._joins(source, select.args["joins"], conjuncts(where.this if where else None))
            where = exp.Where(this=exp.and_(*rest)) if rest else None
        items = self._expand_star(select.expressions, source)
        group = select.args.get("group")
        having = select.args.get("having")
        over = [w for item in items for w in item.find_all(exp.Window) if isinstance(w.this, AGGREGATES)]
        if over:
            if group is not None or having is not None or find_aggregates(
                    [i.transform(lambda n: exp.null() if isinstance(n, exp.Window) else n) for i in items],
                    self._is_python_aggregate):
                raise SqlError("OVER aggregates in a query with GROUP BY or other aggregates are not supported")
            return self._over(source, where.this if where else None, items, over, select.args.get("windows") or [])
        aggregates = find_aggregates(items + ([having.this] if having else []), self._is_python_aggregate)
        if group is not None or aggregates:
            return self._aggregate(source, where.this if where else None, group, items, aggregates,
                                   having.this if having else None)
        return self._calc(source, items, where.this if where else None)

    def _is_python_aggregate(self, name: str) -> bool:
        udf = self.catalog.functions.get(name) or self.catalog.functions.get(name.upper())
        return udf is not None and udf.aggregate() is not None

    def _temporal_sort(self, select: exp.Select) -> PlanNode:
        """ORDER BY rowtime [ASC][, more]: Flink's sort on a time attribute; rows wait until the watermark passes
        their rowtime, then go out in the order (runtime/sql/operators.py, TemporalSortFunction)."""
        order = select.args["order"].expressions
        body = select.copy()
        body.set("order", None)
        base = self._select(body)
        first = order[0]
        if base.rowtime is None or not isinstance(first.this, exp.Column) or first.args.get("desc") \
                or base.scope.resolve(first.this) != base.rowtime:
            raise SqlError("ORDER BY in a streaming query must start with the rowtime attribute ascending (Flink's "
                           "sort on a time attribute), or have a LIMIT")
        require_insert_only("TemporalSort", base.mode, source_digest(original(base)))
        compiler, sort_key = self._sort_key(base, order)
        return Rank(base.fields, INSERT_ONLY, base.rowtime, input=base, partition=[], order=list(order), limit=0,
                    with_rank=False, key_fn=compiler.build("lambda r: 0"), sort_key=sort_key)

    def _sort_key(self, base: PlanNode, order: list[exp.Expr]) -> tuple[ExpressionCompiler, Any]:
        """A compiler over `base`'s scope and the row -> sort key function of ORDER BY `order` (DESC honoured)."""
        from runtime.sql.operators import SortKey

        compiler = ExpressionCompiler(base.scope, self.catalog.functions)
        values = [compiler.compile(o.this) for o in order]
        compiler.namespace["_SortKey"] = SortKey
        compiler.namespace["_desc"] = tuple(bool(o.args.get("desc")) for o in order)
        return compiler, compiler.build("lambda r: _SortKey((" + "".join(v.text + ", " for v in values) + "), _desc)")

    @staticmethod
    def _limit_count(select: exp.Select) -> tuple[int, int]:
        """(m, n) of LIMIT n [OFFSET m]: integer literals, n positive, m 0 or more (Flink's rank range m+1..m+n,
        with ORDER BY or without)."""
        limit = select.args["limit"]
        count = limit.args.get("count") if isinstance(limit, exp.Fetch) else limit.expression  # FETCH FIRST n ROWS
        if not isinstance(count, exp.Literal) or not count.is_int or int(count.name) < 1:
            raise SqlError(f"LIMIT {count.sql() if count is not None else ''}: a positive integer literal is "
                           "supported")
        offset = select.args.get("offset")
        skip = offset.expression if offset is not None else None
        if skip is not None and (not isinstance(skip, exp.Literal) or not skip.is_int or int(skip.name) < 0):
            raise SqlError(f"OFFSET {skip.sql()}: a non-negative integer literal is supported")
        return (int(skip.name) if skip is not None else 0), int(count.name)

    def _limit(self, select: exp.Select) -> PlanNode:
        """LIMIT n without ORDER BY: Flink's streaming Limit, the first n rows to arrive (all rows on one subtask,
        each row ties with the ones kept, so the earlier stays); insert-only over an insert-only input, over an
        updating one a retracted row lets the next one in."""
        offset, limit = self._limit_count(select)
        body = select.copy()
        body.set("limit", None)
        body.set("offset", None)
        base = self._select(body)
        compiler = ExpressionCompiler(base.scope, self.catalog.functions)
        mode = INSERT_ONLY if base.mode.insert_only else RETRACTING
        return Rank(base.fields, mode, base.rowtime if mode.insert_only else None, input=base, partition=[],
                    order=[], limit=offset + limit, offset=offset, with_rank=False,
                    key_fn=compiler.build("lambda r: 0"),
                    sort_key=compiler.build("lambda r: 0"))

    def _order_limit(self, select: exp.Select) -> PlanNode:
        """ORDER BY ... LIMIT n: Flink's streaming Top-N without a partition (one partition: the whole query's
        rows on one subtask); updating, rows entering the first n inserted, those pushed out deleted."""
        offset, limit = self._limit_count(select)
        order = select.args["order"].expressions
        body = select.copy()
        body.set("order", None)
        body.set("limit", None)
        body.set("offset", None)
        base = self._select(body)
        compiler, sort_key = self._sort_key(base, order)
        return Rank(base.fields, RETRACTING, None, input=base, partition=[], order=list(order),
                    limit=offset + limit, offset=offset, with_rank=False, key_fn=compiler.build("lambda r: 0"),
                    sort_key=sort_key)

    def _expand_star(self, items: list[exp.Expr], source: PlanNode) -> list[exp.Expr]:
        out: list[exp.Expr] = []
        for item in items:
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                qualifier = item.table if isinstance(item, exp.Column) else None
                for f in source.fields:
                    if qualifier is None or f.table == qualifier:
                        out.append(exp.column(f.name, f.table))
            else:
                out.append(item)
        return out

    def _calc(self, source: PlanNode, items: list[exp.Expr], condition: exp.Expr | None, *,
              substitutions: dict[str, int] | None = None) -> PlanNode:
        reads_watermark = any(isinstance(f, exp.Anonymous) and f.name.upper() == "CURRENT_WATERMARK"
                              for e in [*items, *([condition] if condition is not None else [])]
                              for f in e.find_all(exp.Anonymous))
        if reads_watermark and not source.mode.insert_only:
            raise SqlError("CURRENT_WATERMARK over an updating input is not supported")
        # CURRENT_WATERMARK reads the watermark the Calc operator passes beside each row (physical: a process)
        compiler = ExpressionCompiler(source.scope, self.catalog.functions, substitutions=substitutions,
                                      watermark="_wm" if reads_watermark else None)
        predicate = None
        source_text = ""
        if condition is not None:
            predicate, source_text = compiler.predicate(condition)
        project, types, text = compiler.row_function(items)
        fields = tuple(Field(_field_name(item, i), t) for i, (item, t) in enumerate(zip(items, types, strict=True)))
        positions = [source.scope.resolve(item) if isinstance(item, exp.Column) else None for item in items]
        rowtime = None
        if source.rowtime is not None and source.rowtime in positions:
            rowtime = positions.index(source.rowtime)
        if positions == list(range(len(source.fields))) and [f.name for f in fields] == source.scope.names():
            if condition is None:  # SELECT * FROM x: nothing to compute
                return _requalified(source, fields)
            return Calc(source.fields, source.mode, source.rowtime, source.windowed, input=source,
                        condition=condition, predicate=predicate, source="where " + source_text,
                        reads_watermark=reads_watermark)  # a filter only
        return Calc(fields, source.mode, rowtime, _windowed_after(source.windowed, positions), input=source,
                    projection=items, condition=condition, project=project, predicate=predicate,
                    source=(text + ("  where " + source_text if source_text else "")), reads_watermark=reads_watermark)

    # -- OVER ------------------------------------------------------------------------------------------------

    def _over(self, source: PlanNode, where: exp.Expr | None, items: list[exp.Expr], over: list[exp.Window],
              named: list[exp.Window]) -> PlanNode:
        """Aggregates OVER one window of the rows (Flink's row-time OverAggregate), then the SELECT list over
        the rows with the aggregates appended. As in Flink, every OVER of one SELECT is the same window."""
        try:
            return self._over_window(source, where, items, over, named)
        except SqlError as exc:
            raise exc.at(*position(over[0])) from None  # an error of the window is placed at its first OVER

    def _over_window(self, source: PlanNode, where: exp.Expr | None, items: list[exp.Expr], over: list[exp.Window],
                     named: list[exp.Window]) -> PlanNode:
        if where is not None:  # WHERE filters the rows before the window sees them
            source = self._calc(source, [exp.column(f.name) for f in source.fields], where)
        require_insert_only("OverAggregate", source.mode, source_digest(original(source)))
        windows = {_window_of(w, named).sql().removeprefix("w ") for w in over}
        if len(windows) != 1:
            raise SqlError("the OVER aggregates of one SELECT must use the same window (Flink's rule): "
                           + "; ".join(sorted(windows)))
        window = _window_of(over[0], named)
        order = list((window.args.get("order") or exp.Order(expressions=[])).expressions)
        if len(order) != 1 or order[0].args.get("desc") or not isinstance(order[0].this, exp.Column) \
                or source.rowtime is None or source.scope.resolve(order[0].this) != source.rowtime:
            raise SqlError("an OVER window must be ORDER BY the rowtime attribute ascending (a column with a "
                           "WATERMARK FOR it); other orders and processing time are not supported")
        rows, preceding = _frame(window.args.get("spec"))
        compiler = ExpressionCompiler(source.scope, self.catalog.functions)
        calls = []
        for w in over:
            call = describe_call(w.this, compiler)
            calls.append(AggregateCall(call.kind, call.argument, call.condition, w.sql(), call.type))
        calls = list({c.text: c for c in calls}.values())
        partition = list(window.args.get("partition_by") or [])
        key_fn = _key_function(compiler, partition) if partition else compiler.build("lambda r: 0")
        width = len(source.fields)
        fields = (*source.fields, *(Field(f"w0$o{i}", c.type) for i, c in enumerate(calls)))
        node = OverAggregate(fields, INSERT_ONLY, source.rowtime, source.windowed, input=source, partition=partition,
                             key_fn=key_fn, calls=calls, aggregate=CompiledAggregate(calls, compiler), rows=rows,
                             preceding=preceding)
        return self._calc(node, items, None, substitutions={c.text: width + i for i, c in enumerate(calls)})

    # -- FROM ------------------------------------------------------------------------------------------------

    def _from(self, from_: exp.From | None) -> PlanNode:
        if from_ is None:
            raise SqlError("a streaming query needs FROM (a table, a view or a window table function)")
        return self._relation(from_.this)

    def _relation(self, node: exp.Expr) -> PlanNode:
        alias = node.alias_or_name if isinstance(node, exp.Table | exp.Subquery) else None
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous) and node.this.name.upper() == "TABLE":
            (call,) = node.this.expressions
            if not isinstance(call, WindowTableFunction):
                raise SqlError(f"TABLE({call.sql()}): only the window functions TUMBLE, HOP, CUMULATE, SESSION are "
                               "supported as table functions")
            planned = self._window_tvf(call)
            return _requalified(planned, planned.fields, node.alias or None)
        if isinstance(node, exp.Table):
            planned = self._named_relation(node.name)
            return _requalified(planned, planned.fields, node.alias or node.name)
        if isinstance(node, exp.Subquery):
            planned = self.plan_query(node.this)
            return _requalified(planned, planned.fields, alias or None)
        raise SqlError(f"{node.sql()[:60]} is not supported in FROM")

    def _named_relation(self, name: str) -> PlanNode:
        if name in self._ctes:
            return self._ctes[name]
        if name in self.catalog.views:
            return self.plan_query(self.catalog.views[name])
        if name in self.streams:
            return self.streams[name]
        return self._scan(self.catalog.table(name))

    def _scan(self, table: TableDef) -> TableScan:
        cached = self._scans.get(table.name)
        if cached is not None:
            return cached
        readable(table)  # a metadata key the connector does not offer is refused here, as Flink plans it
        physical = [Field(c.name, c.type, table.name) for c in table.stored]  # type: ignore[arg-type]
        fields = list(physical)
        computed_fn = None
        computed_text = ""
        computed_cols = [c for c in table.columns if c.computed is not None]
        if computed_cols:
            compiler = ExpressionCompiler(Scope(tuple(physical)), self.catalog.functions)
            exprs = [exp.column(f.name) for f in physical] + [c.computed for c in computed_cols]
            computed_fn, types, computed_text = compiler.row_function(exprs)  # type: ignore[arg-type]
            fields += [Field(c.name, t, table.name) for c, t in zip(computed_cols, types[len(physical):],
                                                                     strict=True)]
        rowtime = None
        if table.watermark is not None:
            rowtime = next(i for i, f in enumerate(fields) if f.name == table.watermark.column)
            if not fields[rowtime].type.timestamp:
                raise SqlError(f"table {table.name}: the watermark's column {table.watermark.column} is a "
                               f"{fields[rowtime].type}; a rowtime attribute must be a TIMESTAMP(3)")
        # the table's own column order: physical and computed interleaved as declared
        declared = [c.name for c in table.columns]
        order = [next(i for i, f in enumerate(fields) if f.name == n) for n in declared]
        if order != list(range(len(fields))):
            inner = computed_fn or tuple
            computed_fn = (lambda fn, idx: lambda r: (lambda v: tuple(v[i] for i in idx))(fn(r)))(inner, order)
            fields = [fields[i] for i in order]
            if rowtime is not None:
                rowtime = order.index(rowtime)
        # a postgres-cdc table is a changelog (runtime/sql/postgres_tables.py): +I, -U, +U and -D rows; so is an
        # upsert-kafka table once normalized by its key (runtime/sql/kafka_tables.py)
        mode = ALL if table.connector in ("postgres-cdc", "upsert-kafka") else INSERT_ONLY
        scan = TableScan(tuple(fields), mode, rowtime, table=table, computed=computed_fn,
                         computed_source=computed_text)
        self._scans[table.name] = scan
        return scan

    def _window_tvf(self, call: WindowTableFunction) -> PlanNode:
        kind = call.args["kind"].name.upper()
        data = call.this
        if isinstance(data, TableArgument):
            source = self._relation(data.this)
        elif isinstance(data, exp.Subquery | exp.Select):
            source = self._relation(data if isinstance(data, exp.Subquery) else exp.Subquery(this=data))
        else:
            raise SqlError(f"{kind}: the first argument is TABLE t or a subquery, got {data.sql()}")
        descriptor = call.args["descriptor"]
        if not isinstance(descriptor, Descriptor) or len(descriptor.expressions) != 1:
            raise SqlError(f"{kind}: the second argument is DESCRIPTOR(time column)")
        time_index = source.scope.resolve(descriptor.expressions[0])
        time_name = source.fields[time_index].name
        proctime = source.rowtime != time_index and _is_proctime(source, time_index, self.catalog)
        if source.rowtime != time_index and not proctime:
            raise SqlError(f"{kind}: column {time_name} is not a time attribute: window table functions need the "
                           "rowtime column of a table with a WATERMARK FOR it, or a processing-time column "
                           "(AS PROCTIME())")
        require_insert_only(f"{kind} window table function", source.mode, source_digest(source))
        args = [interval_ms(a) for a in call.expressions]
        partition = tuple(c.name for c in call.args.get("partition") or [])
        needed = {"TUMBLE": (1, 2), "HOP": (2, 3), "CUMULATE": (2, 3), "SESSION": (1, 1)}[kind]
        if not needed[0] <= len(args) <= needed[1]:
            raise SqlError(f"{kind} takes {needed[0]}{'' if needed[0] == needed[1] else f' or {needed[1]}'} "
                           f"interval arguments, got {len(args)}")
        if kind == "TUMBLE":
            spec = WindowSpec(kind, time_index, time_name, size_ms=args[0], offset_ms=args[1] if len(args) > 1 else 0)
        elif kind in ("HOP", "CUMULATE"):
            slide, size = args[0], args[1]
            if size % slide:
                raise SqlError(f"{kind}: the window size ({size} ms) must be an integral multiple of the "
                               f"{'slide' if kind == 'HOP' else 'step'} ({slide} ms)")
            spec = WindowSpec(kind, time_index, time_name, size_ms=size, slide_ms=slide,
                              offset_ms=args[2] if len(args) > 2 else 0)
        else:
            spec = WindowSpec(kind, time_index, time_name, gap_ms=args[0], partition=partition)
        if proctime:
            spec = replace(spec, proctime=True)
        fields = (*source.fields, Field("window_start", T.TIMESTAMP.not_null()),
                  Field("window_end", T.TIMESTAMP.not_null()), Field("window_time", T.TIMESTAMP.not_null()))
        # processing-time windows have no rowtime and no window columns to join or rank by later: Flink too
        # aggregates them only (their window_time is a processing-time attribute)
        return WindowAssign(fields, INSERT_ONLY, None if proctime else len(fields) - 1,
                            None if proctime else WindowColumns(len(fields) - 3, len(fields) - 2),
                            input=source, window=spec)

    # -- JOIN ----------------------------------------------------------------------------------------------

    def _joins(self, left: PlanNode, joins: list[exp.Join], where: list[exp.Expr]) -> tuple[PlanNode, list[exp.Expr]]:
        """Fold the FROM's joins left to right; WHERE conjuncts over both sides of an inner join become its
        condition. Returns the joined node and the WHERE conjuncts left."""
        for join in joins:
            side = (join.side or "").upper()
            how = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}[side]
            if join.args.get("using"):
                raise SqlError("JOIN ... USING is not supported yet: write ON a.x = b.x")
            conditions = conjuncts(join.args.get("on"))
            if isinstance(join.this, exp.Table) and join.this.args.get("version") is not None:
                if _as_of_rowtime(left, join.this):
                    left = self._temporal_join(left, join.this, how, conditions)
                else:
                    left = self._lookup_join(left, join.this, how, conditions)
                continue
            if isinstance(join.this, exp.Lateral):
                left = self._correlate(left, join.this, how, conditions)
                continue
            right = self._relation(join.this)
            if how == "inner":
                both = [c for c in where if side_of(c, left.scope, right.scope) == "both"]
                where = [c for c in where if not any(c is b for b in both)]
                conditions += both
            left = self._join(left, right, how, conditions)
        return left, where

    def _correlate(self, left: PlanNode, lateral: exp.Lateral, how: str, conditions: list[exp.Expr]) -> PlanNode:
        """LATERAL TABLE(f(args)) [AS T(c1, ...)]: f is a Python table function (CREATE FUNCTION): a generator,
        or a class with an `eval` generator, yielding a tuple per row (a plain value for one column); its
        `result_types` attribute names the columns' SQL types (STRING when it has none)."""
        from runtime.sql.operators import correlate_rows

        table = lateral.this
        if not (isinstance(table, exp.Anonymous) and table.name.upper() == "TABLE" and len(table.expressions) == 1
                and isinstance(table.expressions[0], exp.Anonymous)):
            raise SqlError(f"LATERAL {table.sql()}: only LATERAL TABLE(f(...)) of a Python table function is "
                           "supported")
        call = table.expressions[0]
        if how not in ("inner", "left"):
            raise SqlError("a table function is joined with a comma, CROSS JOIN, JOIN or LEFT JOIN ... ON TRUE")
        if any(not (isinstance(c, exp.Boolean) and c.this) for c in conditions):
            raise SqlError("a join with LATERAL TABLE takes ON TRUE only: filter its rows in WHERE")
        require_insert_only("Correlate", left.mode, source_digest(original(left)))
        udf = self.catalog.functions.get(call.name) or self.catalog.functions.get(call.name.upper())
        if udf is None:
            raise SqlError(f"No match found for function signature {call.name}(...): a table function is declared "
                           "with CREATE FUNCTION ... LANGUAGE PYTHON")
        fn = udf.load()
        declared = udf.declared(fn, "result_types")
        alias = lateral.args.get("alias")
        names = [c.name for c in alias.columns] if alias is not None and alias.columns else \
            [f"f{i}" for i in range(len(declared) if declared else 1)]
        if declared is not None and len(declared) != len(names):
            raise SqlError(f"{call.sql()} has {len(declared)} columns (result_types), the alias names "
                           f"{len(names)}")
        types = [_declared_type(t, call) for t in declared] if declared else [T.STRING.or_null()] * len(names)
        fields = (*left.fields, *(Field(n, t, alias.name if alias is not None and alias.name else None)
                                  for n, t in zip(names, types, strict=True)))
        compiler = ExpressionCompiler(left.scope, self.catalog.functions)
        args = [compiler.compile(a).text for a in call.expressions]
        args_fn = compiler.build("lambda r: (" + "".join(a + ", " for a in args) + ")")
        return Correlate(fields, INSERT_ONLY, left.rowtime, input=left, call=call, how=how,
                         rows_fn=correlate_rows(fn, args_fn, len(names), how == "left", call.sql()))

    def _join(self, left: PlanNode, right: PlanNode, how: str, conditions: list[exp.Expr]) -> PlanNode:
        cond = split_condition(conditions, left.scope, right.scope, left.rowtime, right.rowtime)
        if not cond.left_keys:
            raise SqlError("a join needs an equality between a column of each side (an equi-join); "
                           "cross joins and non-equi joins are not supported")
        left_c = ExpressionCompiler(left.scope, self.catalog.functions)
        right_c = ExpressionCompiler(right.scope, self.catalog.functions)
        left_key_fn = _key_function(left_c, cond.left_keys)
        right_key_fn = _key_function(right_c, cond.right_keys)
        fields = (*left.fields, *(Field(f.name, f.type.or_null() if how in ("left", "full") else f.type, f.table)
                                  for f in right.fields))
        if how in ("right", "full"):
            fields = (*(Field(f.name, f.type.or_null(), f.table) for f in left.fields), *fields[len(left.fields):])
        joined = Scope(tuple(fields))
        rest = exp.and_(*cond.rest) if cond.rest else None
        predicate = ExpressionCompiler(joined, self.catalog.functions).predicate(rest)[0] if rest is not None \
            else None
        window_ends = _window_join(left, right, cond.left_keys, cond.right_keys)
        if window_ends is not None or cond.interval:  # a regular join takes updating inputs; these do not
            for name, node in (("left", left), ("right", right)):
                require_insert_only(f"{'Window' if window_ends is not None else 'Interval'}Join ({name} input)",
                                    node.mode, source_digest(original(node)))
        if window_ends is not None:
            # two windows joined on their bounds: each window's rows joined once it fires, then dropped
            return Join(fields, INSERT_ONLY, None, left=left, right=right, how=how, left_keys=cond.left_keys,
                        right_keys=cond.right_keys, left_key_fn=left_key_fn, right_key_fn=right_key_fn,
                        condition=rest, predicate=predicate, window_ends=window_ends)
        if cond.interval:
            assert cond.lower is not None and cond.upper is not None
            if cond.lower > cond.upper:
                raise SqlError(f"the interval join's time bounds are empty: [{cond.lower}, {cond.upper}] ms")
            if rest is not None and how != "inner":
                raise SqlError("an outer interval join supports key equalities and time bounds only in ON")
            return Join(fields, INSERT_ONLY, None, left=left, right=right, how=how, left_keys=cond.left_keys,
                        right_keys=cond.right_keys, left_key_fn=left_key_fn, right_key_fn=right_key_fn,
                        interval=(cond.lower, cond.upper), condition=rest, predicate=predicate)
        if cond.lower is not None or cond.upper is not None:
            raise SqlError("an interval join needs both a lower and an upper bound on the rowtimes (e.g. "
                           "a.t BETWEEN b.t - INTERVAL '1' HOUR AND b.t)")
        # over an updating side, rows retracted there retract their joined rows: +I/-D out
        insert_only = how == "inner" and left.mode.insert_only and right.mode.insert_only
        mode = INSERT_ONLY if insert_only else RETRACTING
        return Join(fields, mode, None, left=left, right=right, how=how, left_keys=cond.left_keys,
                    right_keys=cond.right_keys, left_key_fn=left_key_fn, right_key_fn=right_key_fn,
                    condition=rest, predicate=predicate, ttl_ms=state_ttl_ms(self.catalog.options))

    def _lookup_join(self, left: PlanNode, dim: exp.Table, how: str, conditions: list[exp.Expr]) -> PlanNode:
        """FOR SYSTEM_TIME AS OF a processing-time attribute of the left side, against a jdbc table: Flink's
        lookup join (AS OF the left side's rowtime is the temporal join: `_temporal_join`)."""
        version = dim.args["version"]
        name = dim.name
        as_of = version.args.get("expression")
        if (version.args.get("kind") or "").upper() != "AS OF" or not isinstance(as_of, exp.Column):
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME: only AS OF a processing-time column (a PROCTIME() computed "
                           "column of the left side) is supported")
        if name in self.catalog.views or name in self._ctes or name in self.streams:
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: a lookup join needs a jdbc table, {name} is a view")
        table = self.catalog.table(name)
        if not _is_proctime(left, left.scope.resolve(as_of), self.catalog):
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF {as_of.sql()}: neither the left side's rowtime (a "
                           "temporal join on event time) nor a processing-time attribute (a lookup join: a "
                           "computed column `AS PROCTIME()` of the left side's table)")
        if table.connector != "jdbc":
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: table {name} is a '{table.connector}' table; a lookup "
                           "join needs a 'jdbc' table")
        if how not in ("inner", "left"):
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: a lookup join is INNER or LEFT, not {how.upper()}")
        readable(table)  # jdbc offers no metadata: a metadata column is refused as a scan refuses it
        alias = dim.alias or name
        right_fields = tuple(Field(c.name, c.type.or_null() if how == "left" else c.type, alias)  # type: ignore[union-attr,arg-type]
                             for c in table.physical)
        cond = split_condition(conditions, left.scope, Scope(right_fields), left.rowtime, None)
        columns = []
        for key in cond.right_keys:
            if not isinstance(key, exp.Column):
                raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: the lookup key {key.sql()} must be a column of "
                               f"{name}")
            columns.append(right_fields[Scope(right_fields).resolve(key)].name)
        if not columns:
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: the ON condition needs an equality between a column "
                           f"of {name} and the left side (the lookup key)")
        if cond.lower is not None or cond.upper is not None:
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: time bounds are not part of a lookup join")
        fields = (*left.fields, *right_fields)
        rest = exp.and_(*cond.rest) if cond.rest else None
        predicate = ExpressionCompiler(Scope(fields), self.catalog.functions).predicate(rest)[0] \
            if rest is not None else None
        key_fn = _key_function(ExpressionCompiler(left.scope, self.catalog.functions), cond.left_keys)
        # over an updating input every change is looked up and keeps its kind (-U/-D looked up again, as in Flink)
        mode = INSERT_ONLY if left.mode.insert_only else left.mode
        return LookupJoin(fields, mode, left.rowtime if mode.insert_only else None, input=left, table=table, how=how,
                          left_keys=cond.left_keys, lookup_columns=tuple(columns), left_key_fn=key_fn,
                          condition=rest, predicate=predicate)

    def _temporal_join(self, left: PlanNode, versioned: exp.Table, how: str, conditions: list[exp.Expr]
                       ) -> PlanNode:
        """FOR SYSTEM_TIME AS OF the left side's rowtime: Flink's event-time temporal join against a versioned
        table (a PRIMARY KEY and a WATERMARK: a table, or a view deduplicating on the rowtime, keeping the last
        row per key). Insert-only, the left side's rowtime kept (runtime/sql/temporal_join.py)."""
        name = versioned.name
        if how not in ("inner", "left"):
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: a temporal join is INNER or LEFT, not {how.upper()}")
        require_insert_only("TemporalJoin (left input)", left.mode, source_digest(original(left)))
        right = self._relation(versioned)
        primary_key = _versioned_key(right)
        if right.rowtime is None or not primary_key:
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF {versioned.args['version'].args['expression'].sql()}: "
                           f"{name} is not a versioned table: an event-time temporal join needs a PRIMARY KEY and a "
                           "WATERMARK on it (or a view keeping the last row per key: ROW_NUMBER() OVER (PARTITION "
                           "BY key ORDER BY rowtime DESC) = 1)")
        cond = split_condition(conditions, left.scope, right.scope, None, None)
        key_names = {right.fields[right.scope.resolve(k)].name for k in cond.right_keys if isinstance(k, exp.Column)}
        if not set(primary_key) <= key_names:
            raise SqlError(f"JOIN {name} FOR SYSTEM_TIME AS OF: the versioned table's primary key "
                           f"[{', '.join(primary_key)}] must be in the join's equalities (ON {name}.key = ...)")
        fields = (*left.fields, *(Field(f.name, f.type.or_null() if how == "left" else f.type, f.table)
                                  for f in right.fields))
        rest = exp.and_(*cond.rest) if cond.rest else None
        predicate = ExpressionCompiler(Scope(fields), self.catalog.functions).predicate(rest)[0] \
            if rest is not None else None
        return TemporalJoin(fields, INSERT_ONLY, left.rowtime, left=left, right=right, how=how,
                            left_keys=cond.left_keys, right_keys=cond.right_keys,
                            left_key_fn=_key_function(ExpressionCompiler(left.scope, self.catalog.functions),
                                                      cond.left_keys),
                            right_key_fn=_key_function(ExpressionCompiler(right.scope, self.catalog.functions),
                                                       cond.right_keys),
                            condition=rest, predicate=predicate, right_deletes=not _deduplicated(right))

    # -- Top-N ---------------------------------------------------------------------------------------------

    def _top_n(self, from_: exp.From | None, where: exp.Expr | None
               ) -> tuple[PlanNode, list[exp.Expr]] | None:
        """`FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) AS rn FROM x) WHERE rn <= N`: the
        Rank node and the outer WHERE's other conjuncts; None when the FROM is not that pattern."""
        if from_ is None or not isinstance(from_.this, exp.Subquery) or not isinstance(from_.this.this, exp.Select):
            return None
        inner = from_.this.this
        ranked = [(i, item) for i, item in enumerate(inner.expressions)
                  if isinstance(item, exp.Alias) and isinstance(item.this, exp.Window)
                  and isinstance(item.this.this, exp.RowNumber)]
        if not ranked:
            return None
        (position, item), = ranked
        window = item.this
        alias = item.alias
        limit = None
        rest = []
        for c in conjuncts(where):
            bound = _rank_bound(c, alias)
            if bound is not None and limit is None:
                limit = bound
            else:
                rest.append(c)
        if limit is None:
            raise SqlError(f"ROW_NUMBER() needs a filter on it in the outer WHERE ({alias} <= N): other uses of "
                           "OVER are not supported yet")
        body = inner.copy()
        body.set("expressions", [e for i, e in enumerate(inner.expressions) if i != position])
        base = self._select(body)
        updating_input = not base.mode.insert_only
        compiler = ExpressionCompiler(base.scope, self.catalog.functions)
        items = body.expressions
        partition = [_over_output(p, items, base.scope) for p in window.args.get("partition_by") or []]
        order = [_over_output(o, items, base.scope)
                 for o in (window.args.get("order") or exp.Order(expressions=[])).expressions]
        if not order:
            raise SqlError("ROW_NUMBER() OVER needs an ORDER BY")
        key_fn = _key_function(compiler, partition) if partition else compiler.build("lambda r: 0")
        values = [compiler.compile(o.this) for o in order]
        descending = tuple(bool(o.args.get("desc")) for o in order)
        from runtime.sql.operators import SortKey

        compiler.namespace["_SortKey"] = SortKey
        compiler.namespace["_desc"] = descending
        sort_key = compiler.build("lambda r: _SortKey((" + "".join(v.text + ", " for v in values) + "), _desc)")
        time_first = (limit == 1 and len(order) == 1 and not descending[0] and base.rowtime is not None
                      and isinstance(order[0].this, exp.Column) and base.scope.resolve(order[0].this) == base.rowtime)
        time_last = (limit == 1 and len(order) == 1 and descending[0] and base.rowtime is not None
                     and isinstance(order[0].this, exp.Column) and base.scope.resolve(order[0].this) == base.rowtime)
        time_first = time_first and not updating_input  # over an updating input a kept first row may be retracted
        time_last = time_last and not updating_input
        mode = INSERT_ONLY if time_first else RETRACTING
        # the rank is a column of the output; an outer query that does not select it drops it in its Calc
        fields = (*base.fields, Field(alias, T.BIGINT.not_null()))
        w = base.windowed
        partition_at = {base.scope.resolve(p) for p in partition if isinstance(p, exp.Column)}
        if w is not None and {w.start, w.end} <= partition_at:
            require_insert_only("WindowRank", base.mode, source_digest(original(base)))
            # a window Top-N (deduplication): the rows of each window ranked once it fires; insert-only
            by_time = limit == 1 and len(order) == 1 and isinstance(order[0].this, exp.Column) \
                and base.fields[base.scope.resolve(order[0].this)].type.timestamp
            return Rank(fields, INSERT_ONLY, base.rowtime, w, input=base, partition=partition, order=order,
                        limit=limit, with_rank=True, key_fn=key_fn, sort_key=sort_key,
                        newest_wins_ties=bool(by_time and descending[0]), window_end=w.end,
                        deduplicates=bool(by_time)), rest
        # keeping the last row per key on the rowtime keeps it a time attribute: a versioned view (temporal join)
        return Rank(fields, mode, base.rowtime if time_first or time_last else None, input=base, partition=partition,
                    order=order, limit=limit, with_rank=True, key_fn=key_fn, sort_key=sort_key,
                    newest_wins_ties=time_last), rest

    # -- GROUP BY --------------------------------------------------------------------------------------------

    def _aggregate(self, source: PlanNode, where: exp.Expr | None, group: exp.Group | None,
                   items: list[exp.Expr], aggregates: list[exp.Expr], having: exp.Expr | None) -> PlanNode:
        keys = list(group.expressions) if group is not None else []
        cascade: WindowColumns | None = None  # grouped by the window columns of a window aggregation's output
        window_node = _window_below(source)
        window_keys = [k for k in keys if isinstance(k, exp.Column) and k.name in WINDOW_COLUMNS]
        windowed = window_node is not None and {k.name for k in window_keys} >= {"window_start", "window_end"}
        if windowed:
            assert window_node is not None
            if window_node.window.kind == "SESSION" and window_node.window.partition:
                partition = [exp.column(p) for p in window_node.window.partition]
                names = {k.name for k in keys if isinstance(k, exp.Column)}
                if not all(p.name in names for p in partition):
                    raise SqlError("SESSION window aggregation: GROUP BY must include the PARTITION BY columns")
            inner = window_node.input
            if where is not None:  # a filter of the window's input rows: below the window operator
                if any(isinstance(c, exp.Column) and c.name in WINDOW_COLUMNS for c in where.find_all(exp.Column)):
                    raise SqlError("a WHERE on window_start/window_end before a window aggregation is not supported")
                inner = self._calc(inner, [exp.column(f.name) for f in inner.fields], where)
            group_keys = [k for k in keys if not (isinstance(k, exp.Column) and k.name in WINDOW_COLUMNS)]
            scope = inner.scope
        else:
            if window_node is not None and source is window_node:
                raise SqlError("a GROUP BY over a window table function must group by window_start and window_end")
            if where is not None:
                source = self._calc(source, [exp.column(f.name) for f in source.fields], where)
            group_keys = keys
            inner = source
            scope = source.scope
            w = source.windowed
            if w is not None and window_node is None:  # GROUP BY the windows of a window aggregation's rows
                at = [scope.resolve(k) if isinstance(k, exp.Column) else None for k in keys]
                if w.start in at and w.end in at:
                    cascade = WindowColumns(at.index(w.start), at.index(w.end))
        compiler = ExpressionCompiler(scope, self.catalog.functions)
        calls = [describe_call(a, compiler) for a in aggregates]
        for call in calls:
            if call.argument is not None:
                for c in call.argument.find_all(exp.Column):
                    if c.name in WINDOW_COLUMNS and windowed:
                        raise SqlError(f"{call.text}: aggregating a window column is not supported")
        updating_input = not inner.mode.insert_only
        if updating_input and (windowed or cascade is not None):
            require_insert_only("GroupAggregate" if not windowed else "WindowAggregate", inner.mode,
                                source_digest(inner))
        # over an updating input the aggregate retracts too, and a group whose last row is retracted is deleted
        aggregate: Any = RetractingAggregate(calls, compiler) if updating_input else CompiledAggregate(calls, compiler)
        key_codes = [compiler.compile(k) for k in group_keys]
        if len(key_codes) == 1:
            key_source = f"lambda r: {key_codes[0].text}"
        else:
            key_source = "lambda r: (" + "".join(c.text + ", " for c in key_codes) + ")"
        key_fn = compiler.build(key_source)
        out_fields = [Field(_key_name(k, i), c.type) for i, (k, c) in enumerate(zip(group_keys, key_codes,
                                                                                   strict=True))]
        rowtime = None
        if windowed:
            out_fields += [Field(n, T.TIMESTAMP.not_null()) for n in WINDOW_COLUMNS]
            rowtime = None if window_node.window.proctime else len(out_fields) - 1  # type: ignore[union-attr]
        first_call = len(out_fields)
        out_fields += [Field(f"agg${i}", c.type) for i, c in enumerate(calls)]
        mode = INSERT_ONLY if windowed or cascade is not None else ALL if updating_input else UPDATING
        node = Aggregate(tuple(out_fields), mode, rowtime, input=inner, keys=group_keys, key_fn=key_fn,
                         key_source=key_source, calls=calls, aggregate=aggregate,
                         window=window_node.window if windowed else None,  # type: ignore[union-attr]
                         windowed=cascade, window_end_key=None if cascade is None else cascade.end)
        # the SELECT list and HAVING over the aggregated rows
        substitutions = {c.text: first_call + i for i, c in enumerate(calls)}
        key_columns = {}
        for i, k in enumerate(group_keys):
            substitutions[k.sql()] = i
            if isinstance(k, exp.Column):
                key_columns[scope.resolve(k)] = i
        if windowed:
            for j, n in enumerate(WINDOW_COLUMNS):
                substitutions[exp.column(n).sql()] = len(group_keys) + j
        field_source = None
        if windowed:  # the Calc reads the window operator's (key, start, end, results) itself: no row between
            keys_source = ["r[0]"] if len(group_keys) == 1 else [f"r[0][{i}]" for i in range(len(group_keys))]
            field_source = [*keys_source, "r[1]", "r[2]", "(r[2] - 1)", *(f"r[3][{j}]" for j in range(len(calls)))]
        post = ExpressionCompiler(node.scope, self.catalog.functions, substitutions=substitutions,
                                  grouping=(scope, key_columns), field_source=field_source)
        predicate = None
        having_text = ""
        if having is not None:
            predicate, having_text = post.predicate(having)
        project, types, text = post.row_function(items)
        fields = tuple(Field(_field_name(item, i), t) for i, (item, t) in enumerate(zip(items, types, strict=True)))
        out_rowtime = None
        if rowtime is not None:
            out_rowtime = next((i for i, item in enumerate(items) if isinstance(item.unalias(), exp.Column)
                                and item.unalias().name == "window_time"), None)
        windowed_out = None
        if cascade is not None:  # the SELECT list keeps the windows if it keeps both bounds
            texts = [item.unalias().sql() for item in items]
            start, end = group_keys[cascade.start].sql(), group_keys[cascade.end].sql()
            if start in texts and end in texts:
                windowed_out = WindowColumns(texts.index(start), texts.index(end))
        if windowed and rowtime is not None:  # the SELECT list's window_start and window_end keep the window
            bounds = [item.unalias().name if isinstance(item.unalias(), exp.Column) else None for item in items]
            if "window_start" in bounds and "window_end" in bounds:
                windowed_out = WindowColumns(bounds.index("window_start"), bounds.index("window_end"))
        return Calc(fields, mode, out_rowtime, windowed_out, input=node, projection=items, condition=having,
                    project=project, predicate=predicate,
                    source=text + ("  having " + having_text if having_text else ""), reads_window_elements=windowed)


def _window_join(left: PlanNode, right: PlanNode, left_keys: list[exp.Expr], right_keys: list[exp.Expr]
                 ) -> tuple[int, int] | None:
    """A window join, as Flink recognizes one: both sides are window TVFs or window aggregations and the equi
    keys equate their window_start and their window_end. Returns the two sides' window_end fields, else None."""
    lw, rw = left.windowed, right.windowed
    if lw is None or rw is None:
        return None
    pairs = {(left.scope.resolve(a), right.scope.resolve(b)) for a, b in zip(left_keys, right_keys, strict=True)
             if isinstance(a, exp.Column) and isinstance(b, exp.Column)}
    if (lw.start, rw.start) in pairs and (lw.end, rw.end) in pairs:
        return lw.end, rw.end
    return None


def _window_of(over: exp.Window, named: list[exp.Window]) -> exp.Window:
    """The window an OVER names: its own (PARTITION BY ... ORDER BY ... frame), or WINDOW w AS (...)'s."""
    if over.args.get("order") is None and over.args.get("spec") is None and over.args.get("partition_by") is None:
        name = over.args.get("alias")
        for w in named:
            if name is not None and w.this.name == name.name:
                return exp.Window(this=exp.var("w"), partition_by=w.args.get("partition_by"),
                                  order=w.args.get("order"), spec=w.args.get("spec"))
        raise SqlError(f"{over.sql()}: an OVER window needs ORDER BY the rowtime"
                       + (f" (no WINDOW {name.name} AS (...) in this SELECT)" if name is not None else ""))
    return exp.Window(this=exp.var("w"), partition_by=over.args.get("partition_by"), order=over.args.get("order"),
                      spec=over.args.get("spec"))


def _frame(spec: exp.WindowSpec | None) -> tuple[bool, int | None]:
    """An OVER window's frame -> (ROWS?, how far back: rows or ms; None for UNBOUNDED). No frame is Flink's
    default, RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW."""
    if spec is None:
        return False, None
    rows = str(spec.args.get("kind", "")).upper() == "ROWS"
    end = spec.args.get("end")
    if str(end).upper() != "CURRENT ROW" or spec.args.get("end_side"):
        raise SqlError(f"OVER ({spec.sql()}): a frame must end at CURRENT ROW in streaming")
    start = spec.args.get("start")
    if str(spec.args.get("start_side", "")).upper() != "PRECEDING":
        raise SqlError(f"OVER ({spec.sql()}): a frame starts at n PRECEDING or UNBOUNDED PRECEDING")
    if isinstance(start, str) and start.upper() == "UNBOUNDED":
        return rows, None
    if rows:
        if not isinstance(start, exp.Literal) or start.is_string:
            raise SqlError(f"OVER ({spec.sql()}): ROWS BETWEEN n PRECEDING takes a number of rows")
        return True, int(start.this)
    if not isinstance(start, exp.Interval):
        raise SqlError(f"OVER ({spec.sql()}): RANGE BETWEEN ... PRECEDING takes an INTERVAL over a rowtime")
    return False, interval_ms(start)


def _windowed_after(windowed: WindowColumns | None, positions: list[int | None]) -> WindowColumns | None:
    """A projection's window columns: where it puts its input's window_start and window_end, if it keeps both."""
    if windowed is None or windowed.start not in positions or windowed.end not in positions:
        return None
    return WindowColumns(positions.index(windowed.start), positions.index(windowed.end))


def _key_function(compiler: ExpressionCompiler, keys: list[exp.Expr]) -> Callable[[Any], Any]:
    codes = [compiler.compile(k) for k in keys]
    if len(codes) == 1:
        return compiler.build(f"lambda r: {codes[0].text}")  # type: ignore[no-any-return]
    return compiler.build("lambda r: (" + "".join(c.text + ", " for c in codes) + ")")  # type: ignore[no-any-return]


def _over_output(node: exp.Expr, items: list[exp.Expr], scope: Scope) -> Any:
    """A PARTITION BY or ORDER BY expression of ROW_NUMBER() OVER, read over the rows of its SELECT (the Rank
    sits above the projection): a column the projection renamed (`B.t AS bid_t`) is read as its new name, a
    qualified one (`A.id` of `A.*`) by its name."""
    def over(column: exp.Expr) -> exp.Expr:
        if not isinstance(column, exp.Column):
            return column
        try:
            scope.resolve(column)
            return column
        except SqlError:
            pass
        for item in items:
            if isinstance(item, exp.Alias) and item.this.sql() == column.sql():
                return exp.column(item.alias)
        if column.table:
            bare = exp.column(column.name)
            scope.resolve(bare)
            return bare
        return column
    return node.copy().transform(over)


def _rank_bound(c: exp.Expr, alias: str) -> int | None:
    """`rn <= N`, `rn < N`, `rn = 1` -> N (the largest rank kept); None for anything else."""
    if not isinstance(c, exp.LTE | exp.LT | exp.EQ) or not isinstance(c.this, exp.Column) \
            or c.this.name != alias or not isinstance(c.expression, exp.Literal) or c.expression.is_string:
        return None
    n = int(c.expression.this)
    if isinstance(c, exp.LT):
        n -= 1
    if isinstance(c, exp.EQ) and n != 1:
        return None
    if n < 1:
        raise SqlError(f"{c.sql()} keeps no row")
    return n


_TTL_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "min": 60_000, "minute": 60_000,
              "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000,
              "day": 86_400_000, "days": 86_400_000}


def state_ttl_ms(options: dict[str, str]) -> int | None:
    """SET 'table.exec.state.ttl' = '1 h' (Flink's duration text; 0: forever) -> ms, or None."""
    text = options.get("table.exec.state.ttl", "").strip().lower()
    if not text:
        return None
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz ").strip()
    unit = text[len(number):].strip() or "ms"
    if not number.isdigit() or unit not in _TTL_UNITS:
        raise SqlError(f"SET 'table.exec.state.ttl' = '{text}': a duration such as '1 h' or '30 min' expected")
    return int(number) * _TTL_UNITS[unit] or None


def _key_name(key: exp.Expr, i: int) -> str:
    return key.name if isinstance(key, exp.Column) else f"key${i}"


def _is_proctime(node: PlanNode, index: int, catalog: Catalog) -> bool:
    """Whether field `index` of the node's rows is a processing-time attribute: a PROCTIME() computed column,
    seen through a table's scan, or (through views and subqueries) by its name."""
    def proctime(column: Any) -> bool:
        return isinstance(column.computed, exp.Anonymous) and column.computed.name.upper() == "PROCTIME"

    base = original(node)
    if isinstance(base, TableScan):
        return proctime(base.table.columns[index])
    name = node.fields[index].name
    return any(c.name == name and proctime(c) for t in catalog.tables.values() for c in t.columns)


def _as_of_rowtime(left: PlanNode, versioned: exp.Table) -> bool:
    """Whether `JOIN t FOR SYSTEM_TIME AS OF x` names the left side's rowtime (a temporal join on event time)."""
    version = versioned.args["version"]
    as_of = version.args.get("expression")
    if (version.args.get("kind") or "").upper() != "AS OF" or not isinstance(as_of, exp.Column):
        return False
    try:
        return left.rowtime is not None and left.scope.resolve(as_of) == left.rowtime
    except SqlError:
        return False


def _versioned_key(node: PlanNode) -> tuple[str, ...]:
    """The primary key of a versioned relation, as names of its fields: a table's PRIMARY KEY, a deduplication
    keeping the last row per key on the rowtime (its partition), through projections keeping the key; () when
    it has none."""
    n = original(node)
    if isinstance(n, TableScan):
        return n.table.primary_key
    if isinstance(n, Rank) and n.limit == 1 and n.newest_wins_ties and n.window_end is None and n.partition:
        columns = [p for p in n.partition if isinstance(p, exp.Column)]
        if len(columns) != len(n.partition):
            return ()
        return tuple(n.input.fields[n.input.scope.resolve(c)].name for c in columns)
    if isinstance(n, Calc):
        inner = _versioned_key(n.input)
        if not inner or n.projection is None:
            return inner
        names = []
        for key in inner:
            at = n.input.scope.names().index(key)
            plain = [(f.name, e.unalias()) for f, e in zip(n.fields, n.projection, strict=True)]
            out = [name for name, e in plain if isinstance(e, exp.Column) and n.input.scope.resolve(e) == at]
            if not out:
                return ()
            names.append(out[0])
        return tuple(names)
    return ()


def _deduplicated(node: PlanNode) -> bool:
    """Whether a relation is a deduplication (through projections): its -D rows are replaced versions."""
    n = original(node)
    while isinstance(n, Calc):
        n = original(n.input)
    return isinstance(n, Rank)


def _window_below(node: PlanNode) -> WindowAssign | None:
    """The window TVF a GROUP BY aggregates: the FROM itself (possibly renamed by an alias)."""
    return node if isinstance(node, WindowAssign) else None


def _requalified(node: PlanNode, fields: tuple[Field, ...], table: str | None = None) -> PlanNode:
    """The same node seen under another name (an alias): its fields qualified by it. Plan nodes are shared, so
    this copies the node's header, not its operator."""
    if table is None and fields == node.fields:
        return node
    renamed = tuple(Field(f.name, f.type, table if table is not None else f.table) for f in fields)
    import copy

    clone = copy.copy(node)
    clone.fields = renamed
    clone._original = getattr(node, "_original", node)  # type: ignore[attr-defined]
    return clone


def original(node: PlanNode) -> PlanNode:
    """The node an alias copy stands for (physical planning translates each original once)."""
    return getattr(node, "_original", node)


def source_digest(node: PlanNode) -> str:
    return node.digest()


def _declared_type(name: Any, call: exp.Expr) -> T.SqlType:
    """A column type a Python table function declares (a Flink type name: 'BIGINT', 'DECIMAL(10, 2)'), nullable."""
    try:
        node = exp.DataType.build(str(name))
    except Exception as exc:
        raise SqlError(f"{call.sql()}: result type {name!r} is not a SQL type") from exc
    return T.from_datatype(node, nullable=True)


def _union_type(types: list[T.SqlType]) -> T.SqlType:
    out = types[0]
    for t in types[1:]:
        out = T.common_type(out, t)
    return out


def _sink_casts(table: TableDef, produced: list[T.SqlType], reorder: Callable[[Any], Any] | None
                ) -> Callable[[Any], Any] | None:
    """Implicit casts from the query's column types to the sink's (an INT into a BIGINT is the same int; a
    BIGINT into a DOUBLE becomes a float); refuses what Flink refuses (a STRING into a BIGINT)."""
    casts: list[Callable[[Any], Any] | None] = []
    for column, got in zip(table.persisted, produced, strict=True):
        want = column.type
        assert want is not None
        if got.name == "NULL" or got.name == want.name or (got.integral and want.integral) \
                or (got.timestamp and want.timestamp):
            casts.append(None)
        elif want.name in ("DOUBLE", "FLOAT") and got.numeric:
            casts.append(lambda v: None if v is None else float(v))
        elif want.name == "DECIMAL" and got.numeric:
            from decimal import Decimal

            casts.append(lambda v: None if v is None else Decimal(str(v)))
        elif want.name == "STRING" and got.name == "STRING":
            casts.append(None)
        else:
            raise SqlError(f"Column types of query result and sink for '{table.qualified()}' do not match: cannot "
                           f"write a {got} into column {column.name} {want}; CAST it")
    if reorder is None and all(c is None for c in casts):
        return None
    pairs = list(enumerate(casts))

    def convert(row: Any) -> Any:
        if reorder is not None:
            row = reorder(row)
        return tuple(v if c is None else c(v) for (_, c), v in zip(pairs, row, strict=True))
    return convert
