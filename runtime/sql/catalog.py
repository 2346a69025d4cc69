"""The catalog a script builds with DDL: tables, views, functions and job options. Pure: no connector is opened.

`Catalog.apply(statement)` takes one parsed DDL statement (CREATE TABLE / VIEW / FUNCTION, SET) and records it;
queries read it through `table`, `view` and `functions`. A table keeps its physical columns (what the connector
reads or writes), its metadata columns (`name TYPE METADATA [FROM 'key'] [VIRTUAL]`, runtime/sql/metadata.py), its
computed columns (`name AS expr`, computed after reading), its watermark (`WATERMARK FOR
col AS col - INTERVAL ...`), its primary key and its WITH options, all checked here so a bad DDL fails before a
query is planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from runtime.sql import types as T
from runtime.sql.dialect import MetadataColumnConstraint
from runtime.sql.errors import SqlError
from runtime.sql.expressions import interval_ms
from runtime.sql.functions import PythonFunction
from runtime.sql.types import SqlType


@dataclass(frozen=True)
class Column:
    name: str
    type: SqlType | None  # None for a computed column until its expression is typed
    computed: exp.Expr | None = None
    metadata: str | None = None  # `METADATA [FROM 'key']`: the connector's metadata key it holds
    virtual: bool = False  # `METADATA ... VIRTUAL`: read only, not written by INSERT


@dataclass(frozen=True)
class Watermark:
    """`WATERMARK FOR column AS column - INTERVAL 'delay'`: Flink's bounded out-of-orderness, delay in ms."""

    column: str
    delay_ms: int


@dataclass(frozen=True)
class TableDef:
    name: str
    columns: tuple[Column, ...]
    options: dict[str, str]
    watermark: Watermark | None = None
    primary_key: tuple[str, ...] = ()

    @property
    def physical(self) -> tuple[Column, ...]:
        """The columns the connector's format reads and writes (neither computed nor metadata)."""
        return tuple(c for c in self.columns if c.computed is None and c.metadata is None)

    @property
    def stored(self) -> tuple[Column, ...]:
        """The columns a source reads, physical and metadata, in declared order (computed ones come after)."""
        return tuple(c for c in self.columns if c.computed is None)

    @property
    def persisted(self) -> tuple[Column, ...]:
        """The columns an INSERT writes, in declared order: physical and not VIRTUAL metadata columns."""
        return tuple(c for c in self.columns if c.computed is None and not c.virtual)

    @property
    def connector(self) -> str:
        return self.options.get("connector", "")

    def qualified(self) -> str:
        return f"default_catalog.default_database.{self.name}"


@dataclass
class Catalog:
    tables: dict[str, TableDef] = field(default_factory=dict)
    views: dict[str, exp.Expr] = field(default_factory=dict)
    functions: dict[str, PythonFunction] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)

    def apply(self, statement: exp.Expr) -> None:
        """Record one DDL statement (CREATE TABLE/VIEW/FUNCTION, SET); raises SqlError for a bad one."""
        if isinstance(statement, exp.Set):
            self._set(statement)
        elif isinstance(statement, exp.Create):
            kind = (statement.args.get("kind") or "").upper()
            if kind == "TABLE":
                self._create_table(statement)
            elif kind == "VIEW":
                self._create_view(statement)
            elif kind == "FUNCTION":
                self._create_function(statement)
            else:
                raise SqlError(f"CREATE {kind} is not supported (CREATE TABLE, VIEW, FUNCTION)")
        else:
            raise SqlError(f"not a DDL statement: {statement.sql()[:60]}")

    # -- lookups ---------------------------------------------------------------------------------------------

    def table(self, name: str) -> TableDef:
        found = self.tables.get(name)
        if found is None:
            raise SqlError(f"Object '{name}' not found: no table or view of that name was created "
                           f"(tables: {', '.join(sorted(self.tables)) or 'none'})")
        return found

    def relation_exists(self, name: str) -> bool:
        return name in self.tables or name in self.views

    # -- statements ------------------------------------------------------------------------------------------

    def _name_free(self, name: str, statement: exp.Create) -> bool:
        if self.relation_exists(name) or name in self.functions:
            if statement.args.get("exists"):
                return False
            raise SqlError(f"Object '{name}' already exists (CREATE ... IF NOT EXISTS skips it)")
        return True

    def _set(self, statement: exp.Set) -> None:
        for item in statement.expressions:
            eq = item.this
            if not isinstance(eq, exp.EQ):
                raise SqlError(f"SET takes 'key' = 'value', got {item.sql()}")
            key, value = _text(eq.this), _text(eq.expression)
            self.options[key] = value

    def _create_table(self, statement: exp.Create) -> None:
        schema = statement.this
        if not isinstance(schema, exp.Schema):
            raise SqlError("CREATE TABLE needs a column list: CREATE TABLE t (a BIGINT, ...) WITH (...)")
        name = schema.this.name
        columns: list[Column] = []
        watermark = None
        primary_key: tuple[str, ...] = ()
        for item in schema.expressions:
            if isinstance(item, exp.ColumnDef):
                columns.append(_column(item))
            elif isinstance(item, exp.WatermarkColumnConstraint):
                watermark = _watermark(item)
            elif isinstance(item, exp.PrimaryKey):
                primary_key = tuple(e.name for e in item.expressions)
                if "NOT ENFORCED" not in [str(o).upper() for o in item.args.get("options") or []]:
                    raise SqlError(f"table {name}: Flink does not support ENFORCED mode for PRIMARY KEY "
                                   "constraint; declare it PRIMARY KEY (...) NOT ENFORCED")
            else:
                raise SqlError(f"table {name}: {item.sql()} is not supported in CREATE TABLE")
        names = [c.name for c in columns]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise SqlError(f"table {name}: column {duplicate} is declared twice")
        for key in primary_key:
            if key not in names:
                raise SqlError(f"table {name}: primary key column {key} is not a column of the table")
            if next(c for c in columns if c.name == key).metadata is not None:
                raise SqlError(f"table {name}: could not create a PRIMARY KEY: column '{key}' is not a physical "
                               "column (it is a metadata column)")
        if watermark is not None:
            rowtime = next((c for c in columns if c.name == watermark.column), None)
            if rowtime is None:
                raise SqlError(f"table {name}: the watermark's column {watermark.column} is not a column")
            if rowtime.type is not None and not rowtime.type.timestamp:
                raise SqlError(f"table {name}: the watermark's column {watermark.column} is a {rowtime.type}; "
                               "a rowtime attribute must be a TIMESTAMP(3) or TIMESTAMP_LTZ(3)")
        options = _options(statement)
        if not options.get("connector"):
            raise SqlError(f"table {name}: WITH ('connector' = '...') is missing (filesystem, datagen, print, "
                           "blackhole)")
        if self._name_free(name, statement):
            self.tables[name] = TableDef(name, tuple(columns), options, watermark, primary_key)

    def _create_view(self, statement: exp.Create) -> None:
        name = statement.this.name
        query = statement.expression
        if not isinstance(query, exp.Query):
            raise SqlError(f"view {name}: CREATE VIEW {name} AS SELECT ...")
        if self._name_free(name, statement):
            self.views[name] = query

    def _create_function(self, statement: exp.Create) -> None:
        name = statement.this.name
        target = statement.expression
        props = statement.args.get("properties")
        language = None
        for p in (props.expressions if props else []):
            if isinstance(p, exp.LanguageProperty):
                language = p.name.upper()
        if language != "PYTHON":
            raise SqlError(f"function {name}: only LANGUAGE PYTHON functions are supported "
                           f"(CREATE FUNCTION {name} AS 'module.function' LANGUAGE PYTHON)")
        if not (isinstance(target, exp.Literal) and target.is_string):
            raise SqlError(f"function {name}: AS 'module.function' expected")
        if self._name_free(name, statement):
            self.functions[name] = PythonFunction(name, target.this)


def _text(node: exp.Expr) -> str:
    if isinstance(node, exp.Literal):
        return str(node.this)
    return node.name or node.sql()


def column_of(item: exp.ColumnDef) -> Column:
    """A column definition of DDL (or of a from_stream schema) as a Column."""
    return _column(item)


def _column(item: exp.ColumnDef) -> Column:
    name = item.name
    constraints = item.args.get("constraints") or []
    computed = next((c.kind.this for c in constraints if isinstance(c.kind, exp.ComputedColumnConstraint)), None)
    if computed is not None:
        return Column(name, None, computed)
    kind = item.args.get("kind")
    if kind is None:
        raise SqlError(f"column {name} has no type")
    not_null = any(isinstance(c.kind, exp.NotNullColumnConstraint) and not c.kind.args.get("allow_null")
                   for c in constraints)
    for c in constraints:
        if isinstance(c.kind, exp.PrimaryKeyColumnConstraint):
            raise SqlError(f"column {name}: declare the key as PRIMARY KEY ({name}) NOT ENFORCED after the columns")
    metadata = next((c.kind for c in constraints if isinstance(c.kind, MetadataColumnConstraint)), None)
    if metadata is None and T.from_datatype(kind).name in ("MAP", "BYTES"):
        raise SqlError(f"column {name}: type {kind.sql()} is supported only for a metadata column for now (Kafka's "
                       "`headers MAP<STRING, BYTES> METADATA`)")
    if metadata is not None:
        key = metadata.this.this if metadata.this is not None else name
        return Column(name, T.from_datatype(kind, nullable=not not_null), metadata=str(key),
                      virtual=bool(metadata.args.get("virtual")))
    return Column(name, T.from_datatype(kind, nullable=not not_null))


def _watermark(item: exp.WatermarkColumnConstraint) -> Watermark:
    column = item.this.name
    expression = item.expression
    if isinstance(expression, exp.Column) and expression.name == column:
        return Watermark(column, 0)
    if (isinstance(expression, exp.Sub) and isinstance(expression.this, exp.Column)
            and expression.this.name == column):
        return Watermark(column, interval_ms(expression.expression))
    raise SqlError(f"WATERMARK FOR {column} AS {expression.sql()}: only `{column}` and `{column} - INTERVAL ...` "
                   "(bounded out-of-orderness) are supported")


def _options(statement: exp.Create) -> dict[str, str]:
    props = statement.args.get("properties")
    out: dict[str, str] = {}
    for p in (props.expressions if props else []):
        if isinstance(p, exp.Property):
            out[_text(p.this)] = _text(p.args["value"])
    return out


def options_of(table: TableDef, key: str, default: Any = None) -> Any:
    return table.options.get(key, default)
