"""The README's Async I/O example, enriching a stream from the local lookup service
(runtime/examples/lookup_service.py), and the variants scripts/bench_async_io.py compares."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from typing import Any

from runtime.api import DiscardSink, FileSink, GeneratorSource, Job, RetryPolicy
from runtime.connectors.http_client import HttpClient

PORT = int(os.environ.get("SLUICE_LOOKUP_PORT", "8099"))
service = HttpClient("127.0.0.1", PORT)


async def lookup(record: Any) -> list[Any]:
    key, seq, _ = record
    answer = await service.get_json(f"/lookup/{key}")
    return [key, seq, answer["score"]]


def build(job: Job) -> None:
    (job.source(GeneratorSource(count=20_000, keys=100), parallelism=2)
        .async_map(lookup, capacity=100, timeout_s=1.0, retry=RetryPolicy(max_attempts=5))
        .sink(FileSink("enriched/")))


def _records() -> int:
    return int(os.environ.get("SLUICE_BENCH_RECORDS", "10000"))


def build_bench_async(job: Job) -> None:
    capacity = int(os.environ.get("SLUICE_BENCH_CAPACITY", "100"))
    (job.source(GeneratorSource(count=_records(), keys=100), parallelism=1)
        .async_map(lookup, capacity=capacity, timeout_s=5.0)
        .sink(DiscardSink()))


_PAUSE_S = float(os.environ.get("SLUICE_BENCH_LATENCY_MS", "20")) / 1000


async def pause(record: Any) -> Any:
    """A call that only waits: the benchmark's side-by-side with PyFlink's async operator (no service)."""
    await asyncio.sleep(_PAUSE_S)
    return record


def build_bench_async_sleep(job: Job) -> None:
    capacity = int(os.environ.get("SLUICE_BENCH_CAPACITY", "100"))
    (job.source(GeneratorSource(count=_records(), keys=100), parallelism=1)
        .async_map(pause, capacity=capacity, timeout_s=60.0)
        .sink(DiscardSink()))


_connection: http.client.HTTPConnection | None = None


def lookup_blocking(record: Any) -> list[Any]:
    """The same lookup with a synchronous client (one keep-alive connection): a call at a time."""
    global _connection
    if _connection is None:
        _connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    _connection.request("GET", f"/lookup/{record[0]}")
    answer = json.loads(_connection.getresponse().read())
    return [record[0], record[1], answer["score"]]


def build_bench_sync(job: Job) -> None:
    (job.source(GeneratorSource(count=_records(), keys=100), parallelism=1)
        .map(lookup_blocking)
        .sink(DiscardSink()))
