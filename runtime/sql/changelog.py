"""Changelog kinds and modes, Flink's: what rows a plan node emits and what a sink accepts. Pure.

A row of an insert-only stream is an insert (+I). An updating stream carries (kind, row) pairs: +I a new row,
-U the old version of an updated row, +U its new version, -D a deleted row. An unbounded GROUP BY updates its
results; a window aggregation emits each window once, so it is insert-only, like a projection or a filter over
an insert-only input.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.sql.errors import SqlError

INSERT = "+I"
UPDATE_BEFORE = "-U"
UPDATE_AFTER = "+U"
DELETE = "-D"


@dataclass(frozen=True)
class ChangelogMode:
    kinds: frozenset[str]

    @property
    def insert_only(self) -> bool:
        return self.kinds == frozenset({INSERT})

    def __str__(self) -> str:
        return "[" + ",".join(k.replace("+I", "I").replace("-U", "UB").replace("+U", "UA").replace("-D", "D")
                              for k in (INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE) if k in self.kinds) + "]"


INSERT_ONLY = ChangelogMode(frozenset({INSERT}))
UPDATING = ChangelogMode(frozenset({INSERT, UPDATE_BEFORE, UPDATE_AFTER}))
ALL = ChangelogMode(frozenset({INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE}))
RETRACTING = ChangelogMode(frozenset({INSERT, DELETE}))  # outer joins, Top-N: rows inserted and retracted


def sink_accepts(connector: str, primary_key: tuple[str, ...]) -> ChangelogMode:
    """What a table sink consumes: print, blackhole and upsert-kafka everything; a filesystem table with a
    primary key upserts (everything), without one it appends (inserts only); so does a jdbc table."""
    if connector in ("print", "blackhole", "upsert-kafka"):
        return ALL
    if connector in ("filesystem", "jdbc") and primary_key:
        return ALL
    return INSERT_ONLY


def check_sink(table_name: str, connector: str, primary_key: tuple[str, ...], produced: ChangelogMode,
               producer: str) -> None:
    """Refuse, at planning, a sink that cannot take what the query produces: Flink's message."""
    accepted = sink_accepts(connector, primary_key)
    if produced.kinds <= accepted.kinds:
        return
    raise SqlError(f"Table sink 'default_catalog.default_database.{table_name}' doesn't support consuming update "
                   f"changes which is produced by node {producer}")


def require_insert_only(what: str, produced: ChangelogMode, producer: str) -> None:
    """An operator that needs an append-only input (a window aggregation, an interval join) refuses an updating
    one, as Flink's planner does."""
    if not produced.insert_only:
        raise SqlError(f"{what} doesn't support consuming update changes which is produced by node {producer}")
