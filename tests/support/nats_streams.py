"""JetStream streams for the NATS tests (needs nats-py: import this after `pytest.importorskip("nats")`): the IN
stream of partitioned input and the OUT stream, publishing the input, and reading a stream back the way a
task reads its source."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.js.api import StreamConfig

from tests.support.source_reading import read_source, run

__all__ = ["make_streams", "publish_input", "read_source", "run", "stream_messages"]

PARTITIONS = 4
DUPLICATE_WINDOW_S = 300.0  # longer than any restart here: a redone commit is deduplicated within it


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
