"""A SQL session on a Job: `job.sql(text)` runs a script's statements into the job's graph.

DDL and SET go to the catalog; each INSERT (or each INSERT of a statement set) is planned (runtime/sql/
logical.py), checked against its sink's changelog mode, and translated into operators (runtime/sql/physical.py).
`table(name)` gives a table's or view's rows as a DataStream, `from_stream(stream, schema)` registers a
DataStream of tuples as a table the next statements can read. Every process builds the same graph from the same
text, as with any job module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from runtime.api import DataStream, Job
from runtime.sql import types as T
from runtime.sql.catalog import Catalog
from runtime.sql.changelog import check_sink
from runtime.sql.dialect import StatementSet
from runtime.sql.errors import SqlError
from runtime.sql.expressions import Field
from runtime.sql.logical import INSERT_ONLY, Planner, PlanNode, SinkNode, StreamScan, original
from runtime.sql.parse import Statement, parse_script
from runtime.sql.physical import Translator

# SET keys a job reads (others are kept and listed by explain as not used)
JOB_OPTIONS = {
    "parallelism.default": "default parallelism of the operators",
    "table.exec.resource.default-parallelism": "default parallelism of the operators",
    "pipeline.name": "the job's name",
    "state.backend.type": "hashmap (memory) or rocksdb",
    "execution.checkpointing.interval": "checkpoint interval (sluice sql / submit --sql)",
    "execution.checkpointing.mode": "EXACTLY_ONCE or AT_LEAST_ONCE (sluice sql / submit --sql)",
    "execution.checkpointing.unaligned.enabled": "true: unaligned checkpoints (sluice sql / submit --sql)",
    "pipeline.auto-watermark-interval": "periodic watermarks of the tables' sources (0: after each row)",
}


@dataclass
class Planned:
    """One INSERT: its plan and the statement it came from."""

    sink: SinkNode
    statement: Statement


class SqlSession:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.catalog = Catalog()
        self.streams: dict[str, StreamScan] = {}
        self.planner = Planner(self.catalog, self.streams)
        self.translator = Translator(job)
        self.planned: list[Planned] = []

    # -- scripts ---------------------------------------------------------------------------------------------

    def execute(self, text: str) -> list[Planned]:
        """Run every statement of `text`; returns the INSERTs planned. Raises SqlError (line, column) on the first
        bad statement, before anything of the script is added to the job."""
        statements = parse_script(text)
        planned: list[Planned] = []
        for statement in statements:
            try:
                planned += self._statement(statement)
            except SqlError as exc:
                raise exc.at(statement.line, statement.column) from None
        for p in planned:  # all statements planned: only now does the job get operators
            self._translate(p)
        self.planned += planned
        return planned

    def _statement(self, statement: Statement) -> list[Planned]:
        node = statement.node
        if isinstance(node, exp.Set | exp.Create):
            self.catalog.apply(node)
            if isinstance(node, exp.Set):
                self._apply_job_options()
            return []
        if isinstance(node, exp.Insert):
            return [self._insert(node, statement)]
        if isinstance(node, StatementSet):
            out = []
            for inner in node.expressions:
                if not isinstance(inner, exp.Insert):
                    raise SqlError("a statement set holds INSERT statements only")
                out.append(self._insert(inner, statement))
            return out
        if isinstance(node, exp.Query):
            raise SqlError("a SELECT on its own has no sink here: INSERT INTO a table (a 'print' table shows rows)")
        if isinstance(node, exp.Drop | exp.Command | exp.Use):
            raise SqlError(f"{node.sql()[:40]}: not supported in a Sluice SQL script")
        raise SqlError(f"unsupported statement: {node.sql()[:60]}")

    def _insert(self, node: exp.Insert, statement: Statement) -> Planned:
        sink = self.planner.plan_insert(node)
        check_sink(sink.table.name, sink.table.connector, sink.table.primary_key, sink.mode,
                   _update_producer(sink.input).digest() if sink.mode != INSERT_ONLY else "")
        return Planned(sink, statement)

    def _translate(self, planned: Planned) -> None:
        try:
            self.translator.translate(planned.sink)
        except SqlError as exc:
            raise exc.at(planned.statement.line, planned.statement.column) from None

    def _apply_job_options(self) -> None:
        options = self.catalog.options
        for key in ("parallelism.default", "table.exec.resource.default-parallelism"):
            if key in options:
                try:
                    value = int(options[key])
                except ValueError:
                    raise SqlError(f"SET '{key}': an integer expected, got '{options[key]}'") from None
                if value > 0:
                    self.job.default_parallelism = value
                    self.translator.parallelism = value
        if "pipeline.name" in options:
            self.job.name = options["pipeline.name"]
        if "pipeline.auto-watermark-interval" in options:
            text = options["pipeline.auto-watermark-interval"]
            # Flink's duration ('200 ms', '1 s'; a bare number is ms), parsed in the sql layer: runtime.graph is
            # above it (tests/unit/test_layering.py)
            from runtime.sql.postgres_tables import duration_ms
            try:
                millis = duration_ms(text)
            except ValueError as exc:
                raise SqlError(f"SET 'pipeline.auto-watermark-interval': {exc}") from None
            self.translator.watermark_interval_ms = millis or None
        if "state.backend.type" in options:
            kind = options["state.backend.type"].lower()
            self.job.state_backend = {"hashmap": "memory"}.get(kind, kind)

    # -- crossing to and from DataStreams --------------------------------------------------------------------

    def table(self, name: str) -> DataStream:
        """The rows of a table or view as a DataStream of tuples (of (kind, row) pairs when it is updating)."""
        node = self.planner.plan_query(exp.select("*").from_(exp.to_table(name)))
        return self.translator.translate(node)

    def from_stream(self, name: str, stream: DataStream, schema: Any, rowtime: str | None = None) -> None:
        """Register `stream` (tuples) as table `name`: `schema` is 'a BIGINT, b STRING' or [(name, type)].
        `rowtime`: the TIMESTAMP column equal to every record's event timestamp (the stream's source has
        watermarks from it), so window table functions can use it."""
        if self.catalog.relation_exists(name) or name in self.streams:
            raise SqlError(f"Object '{name}' already exists")
        fields = tuple(Field(n, t, name) for n, t in _schema(schema))
        index = None
        if rowtime is not None:
            index = next((i for i, f in enumerate(fields) if f.name == rowtime), None)
            if index is None or not fields[index].type.timestamp:
                raise SqlError(f"from_stream {name}: rowtime {rowtime!r} is not a TIMESTAMP column of the schema")
            if not self.job.event_time:
                raise SqlError(f"from_stream {name}: a rowtime needs a source with watermarks= (event time)")
        self.streams[name] = StreamScan(fields, INSERT_ONLY, index, name=name, stream=stream)


def _schema(schema: Any) -> list[tuple[str, T.SqlType]]:
    import sqlglot

    from runtime.sql.dialect import Flink

    if isinstance(schema, str):
        parsed = sqlglot.parse_one(f"CREATE TABLE x ({schema}) WITH ('connector' = 'x')", read=Flink)
        from runtime.sql.catalog import column_of

        out = []
        for col in parsed.this.expressions:
            if not isinstance(col, exp.ColumnDef) or col.args.get("kind") is None:
                raise SqlError(f"schema {schema!r}: 'name TYPE, ...' expected")
            column = column_of(col)
            assert column.type is not None
            out.append((column.name, column.type))
        return out
    return [(n, t if isinstance(t, T.SqlType) else T.SqlType(str(t).upper())) for n, t in schema]


def _update_producer(node: PlanNode) -> PlanNode:
    """The node that turns an insert-only input into updates (what Flink's message names): the deepest updating
    node on the way down."""
    node = original(node)
    for child in node.inputs():
        if not child.mode.insert_only:
            return _update_producer(child)
    return node


def session_of(job: Job) -> SqlSession:
    """The job's SQL session, made on first use (one catalog per job)."""
    session = getattr(job, "_sql_session", None)
    if session is None:
        session = SqlSession(job)
        job._sql_session = session  # type: ignore[attr-defined]
    return session
