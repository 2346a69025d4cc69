"""What the PostgreSQL source and sink share: the driver (psycopg2, the `postgres` extra), connecting with one
clear error, and the catalog look-ups both need (a table's columns and primary key).

psycopg2 because it speaks the streaming replication protocol (`LogicalReplicationConnection`) that change
capture needs; the sink uses the same driver so the extra is one package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.common import extras


class PostgresError(RuntimeError):
    """PostgreSQL could not be reached, or refused what the connector asked for; the message says which."""


class PostgresConfigError(PostgresError):
    """The connector's configuration cannot work against this server (no such table, publication or slot,
    missing permissions, a server setting): no restart fixes it, so the job fails at once."""

    unrecoverable = True


class MissingDependency(RuntimeError):
    pass


def psycopg2() -> Any:
    try:
        import psycopg2
        import psycopg2.extras
        import psycopg2.sql
    except ImportError as exc:
        raise MissingDependency(extras.describe_missing(["postgres"])) from exc
    return psycopg2


def describe(exc: BaseException) -> str:
    """A driver error as one line (psycopg2's messages span lines: the error, then DETAIL and HINT)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def safe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    parts = [p for p in dsn.split() if not p.lower().startswith("password=")]
    if "://" in dsn and "@" in dsn:  # a URI: drop user:password@
        scheme, rest = dsn.split("://", 1)
        return f"{scheme}://{rest.split('@', 1)[1]}"
    return " ".join(parts)


def connect(dsn: str, *, replication: bool = False, connect_timeout_s: float = 10.0) -> Any:
    """A connection (autocommit off), or PostgresError naming the server and what went wrong."""
    pg = psycopg2()
    kwargs: dict[str, Any] = {"connect_timeout": max(1, int(connect_timeout_s))}
    if replication:
        kwargs["connection_factory"] = pg.extras.LogicalReplicationConnection
    try:
        return pg.connect(dsn, **kwargs)
    except pg.Error as exc:
        raise PostgresError(f"cannot connect to PostgreSQL at {safe_dsn(dsn)!r}: {describe(exc)}") from None


def split_table(table: str) -> tuple[str, str]:
    """'schema.name' or 'name' (in public) -> (schema, name)."""
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def qualified(table: str) -> str:
    schema, name = split_table(table)
    return f"{schema}.{name}"


@dataclass(frozen=True, slots=True)
class TableInfo:
    table: str  # schema.name
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key: tuple[str, ...]  # the primary key's columns, in index order (empty: none)


def table_info(cur: Any, table: str) -> TableInfo | None:
    """The table's columns and primary key from the catalog, or None when there is no such table."""
    schema, name = split_table(table)
    cur.execute(
        "SELECT a.attname, a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
        "AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (schema, name))
    rows = cur.fetchall()
    if not rows:
        return None
    cur.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos) ON true "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
        "WHERE n.nspname = %s AND c.relname = %s AND i.indisprimary ORDER BY k.pos", (schema, name))
    key = tuple(r[0] for r in cur.fetchall())
    return TableInfo(f"{schema}.{name}", tuple(r[0] for r in rows), tuple(int(r[1]) for r in rows), key)
