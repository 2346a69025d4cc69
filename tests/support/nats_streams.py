"""JetStream streams for the NATS tests (needs nats-py: import this after `pytest.importorskip("nats")`): the IN
stream of partitioned input and the OUT stream, publishing the input, and reading a stream back the way a
task reads its source."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats
from nats.js.api import StreamConfig

from runtime.connectors.nats import NatsSource

PARTITIONS = 4
DUPLICATE_WINDOW_S = 300.0  # longer than any restart here: a redone commit is deduplicated within it


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def make_streams(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="IN", subjects=["in.>"], duplicate_window=DUPLICATE_WINDOW_S))
    await js.add_stream(StreamConfig(name="OUT", subjects=["out"], duplicate_window=DUPLICATE_WINDOW_S))
    await nc.close()


async def publish_input(url: str, records: list[tuple[str, int]]) -> None:
    """Record i goes to partition i mod PARTITIONS."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    for start in range(0, len(records), 2000):
        acks = [await js.publish_async(f"in.{i % PARTITIONS}", json.dumps(records[i]).encode())
                for i in range(start, min(start + 2000, len(records)))]
        await asyncio.gather(*acks)
    await nc.close()


async def stream_messages(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    info = await nc.jetstream().stream_info(stream)
    await nc.close()
    return int(info.state.messages)


def read_source(source: NatsSource, subtask: int, parallelism: int, *, position: Any = None,
                limit: int | None = None, timeout_s: float = 60.0, keep_open: bool = False,
                reopen: bool = True) -> tuple[list[Any], Any]:
    """Read like the task does (never waiting inside read_batch), up to the end or `limit` records."""
    if reopen:
        source.open(subtask, parallelism)
    try:
        if position is not None:
            source.restore(position)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while limit is None or len(out) < limit:
            assert time.monotonic() < deadline, f"read only {len(out)} records in {timeout_s}s"
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
