"""The batch side of Sluice, on Spark (PySpark, local mode by default).

- `generate`: write a deterministic input data set (Parquet rows of key, seq,
  event_time_ms) for jobs and benchmarks.
- `verify`: recompute a query's expected result from that input and compare
  it with a job's committed output: missing, duplicate and wrong rows.

PySpark is imported lazily (inside `spark.start_session`), so importing this
package, or running any other `sluice` command, never needs Java or Spark.
Every function takes plain arguments and a SparkSession, so callers (the CLI,
tests) decide how long a session lives.
"""

from runtime.data.spark import DataError, start_session, stop_session

__all__ = ["DataError", "start_session", "stop_session"]
