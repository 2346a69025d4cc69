"""The state processor on Spark: a checkpoint's state as a DataFrame, and savepoints from DataFrames.

    from runtime.data import start_session
    from runtime.data.state_processor import read_state, bootstrap

    spark = start_session()                       # local[2]; any master: start_session("spark://host:7077")
    df = read_state(spark, "state/checkpoints/job-1/chk-7", uid="counts")          # key, key_group, state, value
    df.groupBy("state").count().show()
    bootstrap(spark, "history.parquet", "savepoints/initial", uid="counts", job="countjob:build",
              key_col="word", state_name="count", value_col="n")

Decoding and encoding the checkpoint files is runtime/data/checkpoint_state.py's (no Spark); this module only
turns its rows into Arrow columns and DataFrames, and DataFrames back into (state, key, value) entries.

Columns: a key or value column is typed natively when Arrow represents every value exactly (ints, floats,
strings, bytes, booleans, lists of those, ...); otherwise (tuple keys, maps with varying keys, mixed types) it
is binary msgpack, named `<column>_msgpack`, which `bootstrap` decodes again. So read -> bootstrap restores
exactly the state that was read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgpack

from runtime.common.values import packer_default, unpack_ext
from runtime.data.checkpoint_state import (
    ROW_FIELDS,
    at_parallelism,
    graph_of_job,
    open_checkpoint,
    savepoint_from_entries,
    state_rows,
    target_in,
)
from runtime.data.spark import DataError
from runtime.state.codec import hashable

MSGPACK_SUFFIX = "_msgpack"
_DEFAULT = packer_default("a state processor column")
# columns whose values are not always of one exact Arrow type: the others are ints and strings by construction
_OPAQUE = {"key", "value", "map_key", "record"}


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True in Python, not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def column(name: str, values: Sequence[Any]) -> tuple[str, Any]:
    """(column name, Arrow array): native if Arrow holds every value exactly, else `<name>_msgpack` bytes."""
    import pyarrow as pa

    if name in _OPAQUE:
        plain = [list(v) if isinstance(v, tuple) else v for v in values]
        try:
            array = pa.array(plain)
            if array.type != pa.null() and _same(array.to_pylist(), values):
                return name, array
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        return name + MSGPACK_SUFFIX, pa.array([msgpack.packb(v, use_bin_type=True, default=_DEFAULT)
                                                   for v in values], pa.binary())
    return name, pa.array(values)


def rows_table(kind: str, rows: Iterable[Sequence[Any]]) -> Any:
    """The rows of one kind (checkpoint_state.ROW_FIELDS) as an Arrow table."""
    import pyarrow as pa

    fields = ROW_FIELDS[kind]
    columns: list[list[Any]] = [[] for _ in fields]
    for row in rows:
        for values, value in zip(columns, row, strict=True):
            values.append(value)
    if not columns[0]:  # no rows: typed empty columns, so Spark writes a usable schema
        return pa.table({f + (MSGPACK_SUFFIX if f in _OPAQUE else ""):
                         pa.array([], pa.binary() if f in _OPAQUE else pa.string() if f in ("state", "domain", "side")
                                  else pa.int64()) for f in fields})
    named = [column(f, values) for f, values in zip(fields, columns, strict=True)]
    return pa.table({name: array for name, array in named})


def column_values(table: Any, name: str) -> list[Any]:
    """A column's Python values; `<name>_msgpack` (binary msgpack) decoded, when the plain one is absent."""
    if name in table.column_names:
        return list(table.column(name).to_pylist())
    packed = name + MSGPACK_SUFFIX
    if packed in table.column_names:
        return [msgpack.unpackb(v, raw=False, strict_map_key=False, ext_hook=unpack_ext)
                for v in table.column(packed).to_pylist()]
    raise DataError(f"no column {name!r} (there are {', '.join(table.column_names)})")


def table_entries(table: Any, *, key_col: str, value_col: str, state_name: str | None,
                  state_col: str = "state") -> Iterator[tuple[str, Any, Any]]:
    """(state, key, value) entries of an Arrow table: every row under `state_name`, or under its `state_col`."""
    keys = [hashable(k) for k in column_values(table, key_col)]
    values = column_values(table, value_col)
    states = [state_name] * len(keys) if state_name is not None else column_values(table, state_col)
    for state, key, value in zip(states, keys, values, strict=True):
        if not isinstance(state, str) or not state or state.startswith("\0"):
            raise DataError(f"state name {state!r} is not a user state name")
        yield state, key, value


def check_columns(names: Sequence[str], source: str, *, key_col: str, value_col: str,
                  state_name: str | None) -> list[str]:
    """The input's columns to read; DataError naming what is missing (before anything is written)."""
    wanted = [key_col, value_col] + ([] if state_name is not None else ["state"])
    picked = []
    for name in wanted:
        found = name if name in names else name + MSGPACK_SUFFIX if name + MSGPACK_SUFFIX in names else None
        if found is None:
            extra = " (or give --state-name)" if name == "state" else ""
            raise DataError(f"{source} has no column {name!r}{extra}; its columns are {', '.join(names)}")
        picked.append(found)
    return picked


# -- Spark -----------------------------------------------------------------------------------------------------


def read_state(spark: Any, checkpoint: str, uid: str, kind: str = "value", *, state_name: str | None = None,
               remote_address: str | None = None) -> Any:
    """A DataFrame of operator `uid`'s state of one kind in a checkpoint or savepoint (columns:
    checkpoint_state.ROW_FIELDS, `_msgpack` for values Arrow cannot hold exactly)."""
    cp = open_checkpoint(checkpoint)
    rows = state_rows(cp, uid, kind, state_name=state_name, remote_address=remote_address)
    return spark.createDataFrame(rows_table(kind, rows))


def bootstrap(spark: Any, source: str, out: str, *, uid: str, job: str, key_col: str, value_col: str = "value",
              state_name: str | None = None, parallelism: int | None = None) -> dict[str, int]:
    """Write a savepoint of job `job` (MODULE:FUNCTION) in which operator `uid` holds, for each row of the
    Parquet data `source`, the value of `value_col` under key `key_col` (state `state_name`, or the row's
    `state`). Other operators start empty. Spark reads and projects the input; the driver cuts it by key group
    and writes the files. Returns {"keys", "subtasks"}."""
    graph, max_parallelism = graph_of_job(job)
    target = target_in(graph, uid, max_parallelism, f"job {job}")
    if parallelism is not None:
        graph, target = at_parallelism(graph, target, parallelism)
    try:
        frame = spark.read.parquet(source)
    except Exception as exc:  # Spark's AnalysisException for a missing or unreadable path
        raise DataError(f"{source}: cannot read it as Parquet ({str(exc).splitlines()[0]})") from None
    picked = check_columns(frame.columns, source, key_col=key_col, value_col=value_col, state_name=state_name)
    table = frame.select(*picked).toArrow()
    entries = table_entries(table, key_col=key_col, value_col=value_col, state_name=state_name)
    return savepoint_from_entries(out, entries, target, graph, entry=job, name=job)
