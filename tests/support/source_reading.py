"""Reading a connector's source the way its task does, for the connector tests: the position taken before each
batch (a source may decide there where its next batch comes from), never waiting inside read_batch, sleeping
the source's idle wait between empty batches, with a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.connectors.source import Source


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def read_source(source: Source, subtask: int, parallelism: int, *, position: Any = None,
                limit: int | None = None, timeout_s: float = 60.0, keep_open: bool = False,
                reopen: bool = True) -> tuple[list[Any], Any]:
    """Up to the end or `limit` records, after restoring `position`: (the records, the last position).
    `reopen=False` reads on from a source already open; `keep_open` leaves it open."""
    if reopen:
        source.open(subtask, parallelism)
    try:
        if position is not None:
            source.restore(position)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while limit is None or len(out) < limit:
            assert time.monotonic() < deadline, f"read only {len(out)} records in {timeout_s}s"
            source.position()
            batch = source.read_batch(100 if limit is None else min(100, limit - len(out)))
            if batch is None:
                break
            if not batch:
                time.sleep(source.idle_wait_s())
            out += batch
        return out, source.position()
    finally:
        if not keep_open:
            source.close()
