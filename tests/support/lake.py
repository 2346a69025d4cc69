"""Lakehouse tables for the tests: input files of (key, i) records, the keyed counts they must produce, and the
Delta log read back (which commits carried which application transactions)."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from runtime.common import objectstore


def write_input_files(directory: Path, files: int, records_per_file: int, *, keys: int = 30, seed: int = 3,
                      first: int = 0) -> list[tuple[str, int]]:
    """`files` JSON-lines files of [key, i] records; returns the records."""
    rng = random.Random(seed + first)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(first, first + files):
        rows = [(f"k{rng.randrange(keys):02d}", f * records_per_file + i) for i in range(records_per_file)]
        tmp = directory / f".in-{f:03d}.json.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(directory / f"in-{f:03d}.json")  # appears whole: the source never sees half a file
        out += rows
    return out


def wrong_counts(rows: list[tuple[str, int]], records: list[tuple[str, int]]) -> dict[str, Any]:
    """Keys whose (key, n) rows are not exactly 1..count(key), each once; {} when the output is exact."""
    got: dict[str, list[int]] = defaultdict(list)
    for key, n in rows:
        got[key].append(n)
    expected = Counter(k for k, _ in records)
    wrong: dict[str, Any] = {}
    for key in sorted(set(got) | set(expected)):
        if sorted(got[key]) != list(range(1, expected[key] + 1)):
            seen = Counter(got[key])
            wrong[key] = {"expected": expected[key], "got": len(got[key]),
                          "duplicated": sorted(n for n, m in seen.items() if m > 1)[:5],
                          "missing": sorted(set(range(1, expected[key] + 1)) - set(seen))[:5]}
    return wrong


def delta_transactions(table: str) -> list[list[tuple[str, int]]]:
    """Per Delta commit (in version order) the (appId, version) transactions it carried."""
    log = objectstore.join(table, "_delta_log")
    names = sorted(n for n in objectstore.list_children(log) if n.endswith(".json"))
    out = []
    for name in names:
        txns = []
        for line in objectstore.read(objectstore.join(log, name)).decode().splitlines():
            action = json.loads(line)
            if "txn" in action:
                txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
        out.append(txns)
    return out


def delta_rows(table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable

    from runtime.connectors.delta import storage_options

    data = DeltaTable(table, storage_options=storage_options(table)).to_pyarrow_table(columns=columns)
    return list(zip(*(data.column(c).to_pylist() for c in columns), strict=True))
