"""A script's text -> its statements (sqlglot trees in the Flink dialect), each with the line and column it
starts at. sqlglot's parse and tokenize errors become one SqlError naming the line, the column and what was
expected."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from runtime.sql.dialect import Flink, StatementSet, StatementSetBegin
from runtime.sql.errors import SqlError


@dataclass(frozen=True)
class Statement:
    node: exp.Expr
    line: int
    column: int


def parse_script(text: str) -> list[Statement]:
    """Every statement of the script, statement sets folded into one StatementSet each."""
    try:
        tokens = Flink().tokenize(text)
    except TokenError as exc:
        raise _token_error(text, exc) from None
    starts: list[tuple[int, int]] = []
    chunk_start = True
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            chunk_start = True
            continue
        if chunk_start:
            starts.append((token.line, max(1, token.col - len(token.text) + 1)))
            chunk_start = False
    try:
        nodes = [n for n in sqlglot.parse(text, read=Flink) if n is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        near = str(first.get("highlight") or "")
        col = first.get("col")
        if isinstance(col, int) and near:
            col = max(1, col - len(near) + 1)  # sqlglot names the token's last column
        raise SqlError(_expected(str(first.get("description", exc)).split("\n")[0], near), line=first.get("line"),
                       column=col) from None
    statements: list[Statement] = []
    current: list[exp.Expr] | None = None
    opened: tuple[int, int] = (1, 1)
    for node, (line, col) in zip(nodes, starts, strict=False):
        if isinstance(node, StatementSetBegin):
            current = list(node.expressions)
            opened = (line, col)
        elif current is not None and isinstance(node, exp.EndStatement):
            statements.append(Statement(StatementSet(expressions=current), *opened))
            current = None
        elif current is not None:
            current.append(node)
        else:
            statements.append(Statement(node, line, col))
    if current is not None:
        raise SqlError("the statement set is not closed: END; expected", line=opened[0], column=opened[1])
    return statements


def _expected(description: str, near: str) -> str:
    """sqlglot's description of a parse error in the words of a SQL user: what was expected, what came."""
    got = f"'{near}'" if near else "the end of the script"
    if description.startswith("Required keyword:"):
        return f"an expression is missing near {got}"
    if description.startswith("Invalid expression") or description.startswith("Unexpected token"):
        return f"unexpected {got}"
    if description.startswith("Expected ") and " but got " in description:
        return f"expected {description[9:].split(' but got ')[0]}, got {got}"
    if description.startswith("Expecting "):
        return f"expected {description[10:]}, got {got}"
    if description.startswith("Expected "):
        return f"expected {description[9:].split(' after ')[0]}, got {got}"
    return f"{description} (at {got})"


def _token_error(text: str, exc: TokenError) -> SqlError:
    message = str(exc)
    # sqlglot names the text around the failure; find where it starts for a line and column
    fragment = message.split("'", 1)[1].rsplit("'", 1)[0] if "'" in message else ""
    where = text.find(fragment) if fragment else -1
    if where >= 0 and "'" in fragment:  # the string that is never closed starts at the context's last quote
        where += fragment.rfind("'")
    line = text.count("\n", 0, where) + 1 if where >= 0 else None
    column = where - (text.rfind("\n", 0, where) + 1) + 1 if where >= 0 else None
    return SqlError("a string literal is not closed (a ' is missing), or a character is not SQL", line=line,
                    column=column)
