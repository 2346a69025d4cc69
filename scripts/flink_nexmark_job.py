"""One Nexmark query on Apache Flink SQL (PyFlink TableEnvironment, streaming mode, the local mini cluster), for
scripts/nexmark_compare.py: reads the tables' DDL and a SELECT, runs it over the bounded files, applies the
changelog it emits (+I/+U add a row, -U/-D take one away; with --key, the last row per key: Flink may drop
the -U of an upsert changelog) and prints the final rows as JSON lines, then one line
`{"flink_seconds": S, "changes": N}` (S: from submitting the query to the end of its results). With --blackhole
COLUMNS the rows go to a 'blackhole' table instead and only that line is printed (a throughput run).

Runs with the Python of a venv that has `apache-flink` installed (never Sluice's): --flink-python of the
comparison script.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections import Counter
from decimal import Decimal
from typing import Any


def normal(value: Any) -> Any:
    """A value as Sluice's JSON output writes it: timestamps 'yyyy-MM-dd HH:mm:ss[.f]', decimals as floats."""
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        millis = value.microsecond // 1000
        return text + ("." + f"{millis:03d}".rstrip("0") if millis else "")
    if isinstance(value, Decimal):
        return float(value)
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", required=True, help="a file of CREATE TABLE statements")
    parser.add_argument("--query", required=True, help="the SELECT")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--key", default="", help="the result's key columns (comma-separated) when it updates")
    parser.add_argument("--blackhole", default="",
                        help="the result's columns: INSERT INTO a 'blackhole' table of them instead of collecting the "
                             "rows (a throughput run: no Python row conversion); prints only the summary line")
    args = parser.parse_args()
    from pyflink.common import RowKind
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", str(args.parallelism))
    env.get_config().set("table.exec.source.idle-timeout", "1 s")
    with open(args.tables, encoding="utf-8") as f:
        text = "\n".join(line for line in f.read().splitlines() if not line.strip().startswith("--"))
    for statement in text.split(";"):
        if statement.strip():
            env.execute_sql(statement)
    if args.blackhole:
        env.execute_sql(f"CREATE TABLE nexmark_out ({args.blackhole}) WITH ('connector' = 'blackhole')")
        started = time.monotonic()
        env.execute_sql(f"INSERT INTO nexmark_out {args.query}").wait()
        sys.stdout.write(json.dumps({"flink_seconds": time.monotonic() - started, "changes": None}) + "\n")
        return 0
    started = time.monotonic()
    result = env.execute_sql(args.query)
    rows: Counter[str] = Counter()
    changes = 0
    names = [k.strip().strip("`") for k in args.key.split(",") if k.strip()]
    positions = [result.get_table_schema().get_field_names().index(n) for n in names]
    by_key: dict[str, str] = {}
    with result.collect() as it:
        for row in it:
            changes += 1
            values = [normal(v) for v in row]
            text = json.dumps(values)
            adds = row.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER)
            if positions:  # an upsert changelog (Flink may send +U without its -U): the last row per key
                k = json.dumps([values[i] for i in positions])
                if adds:
                    by_key[k] = text
                else:
                    by_key.pop(k, None)
            elif adds:
                rows[text] += 1
            else:
                rows[text] -= 1
    rows.update(by_key.values())
    seconds = time.monotonic() - started
    for key, n in sorted(rows.items()):
        for _ in range(n):
            sys.stdout.write(key + "\n")
    sys.stdout.write(json.dumps({"flink_seconds": seconds, "changes": changes}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
