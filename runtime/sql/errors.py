"""The one error a SQL script gets: what is wrong, and where (line and column, 1-based) when a place is known."""

from __future__ import annotations


class SqlError(ValueError):
    """Bad SQL or a query Sluice cannot plan: `str()` is one line for the user."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.line is None:
            return self.message
        return f"line {self.line}, column {self.column}: {self.message}"

    def at(self, line: int | None, column: int | None) -> SqlError:
        """This error placed at a statement's position, unless it knows a place of its own."""
        if self.line is None and line is not None:
            self.line, self.column = line, column
        return self
