"""Flink SQL on Sluice: parse (sqlglot + our Flink dialect), catalog, logical plan, compiled expressions,
physical plan onto DataStream operators, explain. `job.sql(text)` is the way in (README, SQL)."""

from runtime.sql.errors import SqlError

__all__ = ["SqlError"]
