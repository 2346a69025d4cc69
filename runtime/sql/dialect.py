"""Flink's SQL dialect as a sqlglot dialect: what Flink has and sqlglot's own dialects lack.

sqlglot parses the bulk (SELECT, expressions, CREATE TABLE/VIEW/FUNCTION, SET); this adds, as small parser
extensions and never a parser of our own:
- `WATERMARK FOR col AS expr` inside CREATE TABLE (the constraint sqlglot's RisingWave dialect has);
- metadata columns `col TYPE METADATA [FROM 'key'] [VIRTUAL]` (a column constraint);
- window table functions `TUMBLE|HOP|CUMULATE|SESSION(TABLE t, DESCRIPTOR(col), INTERVAL ...)`, their
  `TABLE t` and `DESCRIPTOR(col)` arguments, positional or named (`DATA => TABLE t`), and `FROM TABLE(...)`;
- `EXECUTE STATEMENT SET BEGIN ... END;` and `BEGIN STATEMENT SET; ... END;` (several INSERTs, one job);
- backquoted identifiers and Flink's type names (STRING, TIMESTAMP_LTZ).
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.parser import Parser
from sqlglot.tokens import Tokenizer, TokenType

WINDOW_FUNCTIONS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")


class TableArgument(exp.Expression):
    """`TABLE t` as the argument of a table function."""

    arg_types = {"this": True}


class Descriptor(exp.Expression):
    """`DESCRIPTOR(col, ...)`: the time column of a window table function."""

    arg_types = {"expressions": True}


class WindowTableFunction(exp.Expression):
    """`TUMBLE(TABLE t, DESCRIPTOR(c), INTERVAL ...)` and its kin; `kind` is the function's name.
    `args` are the positional arguments after the descriptor (sizes, slides, steps, gaps), `partition` the
    PARTITION BY of a SESSION."""

    arg_types = {"kind": True, "this": True, "descriptor": True, "expressions": False, "partition": False}


class StatementSetBegin(exp.Expression):
    """`EXECUTE STATEMENT SET BEGIN [first insert]` or `BEGIN STATEMENT SET`: statements up to the next `END`
    belong to one statement set. sqlglot splits a script at every `;` before parsing, so the set is put together
    from the statements afterwards (`group_statement_sets`)."""

    arg_types = {"expressions": False}


class StatementSet(exp.Expression):
    """`EXECUTE STATEMENT SET BEGIN insert; insert; END`: its INSERTs run as one job."""

    arg_types = {"expressions": True, "unterminated": False}


class MetadataColumnConstraint(exp.Expression, exp.ColumnConstraintKind):
    """`METADATA [FROM 'key'] [VIRTUAL]` after a column's type: the column is the connector's metadata `key`
    (the column's name without FROM); VIRTUAL ones are read only, never written by an INSERT."""

    arg_types = {"this": False, "virtual": False}


class FlinkParser(Parser):
    CONSTRAINT_PARSERS = {
        **Parser.CONSTRAINT_PARSERS,
        "METADATA": lambda self: self.expression(MetadataColumnConstraint(
            this=self._parse_string() if self._match(TokenType.FROM) else None,
            virtual=exp.Boolean(this=True) if self._match_text_seq("VIRTUAL") else None,
        )),
        "WATERMARK": lambda self: self.expression(
            exp.WatermarkColumnConstraint(
                this=self._match(TokenType.FOR) and self._parse_column(),
                expression=self._match(TokenType.ALIAS) and self._parse_disjunction(),
            )
        ),
    }
    SCHEMA_UNNAMED_CONSTRAINTS = {*Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    FUNCTION_PARSERS = {
        **Parser.FUNCTION_PARSERS,
        **{name: (lambda kind: lambda self: self._parse_window_tvf(kind))(name) for name in WINDOW_FUNCTIONS},
        "DESCRIPTOR": lambda self: self.expression(Descriptor(expressions=self._parse_csv(self._parse_column))),
    }

    STATEMENT_PARSERS = {
        **Parser.STATEMENT_PARSERS,
        TokenType.EXECUTE: lambda self: self._parse_statement_set_begin(execute=True),
        TokenType.BEGIN: lambda self: self._parse_statement_set_begin(execute=False),
    }

    FUNC_TOKENS = {*Parser.FUNC_TOKENS, TokenType.SESSION}

    def _parse_named_argument(self) -> Any:
        """An argument of a window function, `NAME => value` or plain; the name is dropped: Flink's named
        arguments are in the positional order anyway (DATA, TIMECOL, SLIDE|STEP, SIZE, OFFSET)."""
        if self._curr and self._next and self._next.token_type == TokenType.FARROW:
            self._advance(2)
        if self._match(TokenType.TABLE):
            return self.expression(TableArgument(this=self._parse_table_parts()))
        return self._parse_assignment()

    def _parse_window_tvf(self, kind: str) -> exp.Expr:
        data = self._parse_named_argument()
        partition = None
        if self._match(TokenType.PARTITION_BY):
            partition = [self._parse_column()]
            # the columns end where the descriptor (or its named argument) begins
            while (self._match(TokenType.COMMA)
                   and self._curr.text.upper() not in ("DESCRIPTOR", "TIMECOL")):
                partition.append(self._parse_column())
        else:
            self._match(TokenType.COMMA)
        descriptor = self._parse_named_argument()
        rest = []
        while self._match(TokenType.COMMA):
            rest.append(self._parse_named_argument())
        return self.expression(WindowTableFunction(kind=exp.Var(this=kind), this=data, descriptor=descriptor,
                                                   expressions=rest, partition=partition))

    def _parse_statement_set_begin(self, *, execute: bool) -> exp.Expr:
        start = self._prev
        words = ("STATEMENT", "SET", "BEGIN") if execute else ("STATEMENT", "SET")
        if not self._match_text_seq(*words):
            return self._parse_as_command(start)
        first = self._parse_statement() if execute and self._curr else None
        return self.expression(StatementSetBegin(expressions=[first] if first is not None else []))


def group_statement_sets(statements: list[Any]) -> list[Any]:
    """Fold each `StatementSetBegin ... END` run of statements into one StatementSet."""
    out: list[Any] = []
    current: list[Any] | None = None
    for statement in statements:
        if isinstance(statement, StatementSetBegin):
            current = list(statement.expressions)
        elif current is not None and isinstance(statement, exp.EndStatement):
            out.append(StatementSet(expressions=current))
            current = None
        elif current is not None:
            current.append(statement)
        elif statement is not None:
            out.append(statement)
    if current is not None:
        out.append(StatementSet(expressions=current, unterminated=True))
    return out


class Flink(Dialect):
    """Apache Flink SQL (the subset runtime/sql plans)."""

    NORMALIZE_FUNCTIONS = "upper"

    class Tokenizer(Tokenizer):
        IDENTIFIERS = ["`"]
        QUOTES = ["'"]
        STRING_ESCAPES = ["'", "\\"]
        KEYWORDS = {
            **Tokenizer.KEYWORDS,
            "STRING": TokenType.TEXT,
            "TIMESTAMP_LTZ": TokenType.TIMESTAMPLTZ,
            "EXECUTE": TokenType.EXECUTE,
            "=>": TokenType.FARROW,
        }
        # EXECUTE is a command to sqlglot (the rest of the statement kept as text); here it opens a statement set
        COMMANDS = Tokenizer.COMMANDS - {TokenType.EXECUTE}

    Parser = FlinkParser
