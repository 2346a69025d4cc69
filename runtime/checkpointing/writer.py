"""The worker's checkpoint writer: serialises and persists checkpoint files off the event loop.

One thread per worker takes requests from a bounded queue: the task hands
over the immutable pieces (copied state tables, buffers, which are bytes) and
keeps processing; the thread encodes them, writes a temporary file, fsyncs
it and renames it into place (or, for an `s3://` checkpoint directory,
uploads it as one object: runtime/common/objectstore.py), then resolves the
task's future on the loop. The task acks only after every write resolved, so
on an object store every task file exists before the coordinator writes
`_metadata`.
The semaphore bounds how many requests (and so how much memory) wait.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.common import objectstore
from runtime.common.checksums import checksum


@dataclass(frozen=True)
class Encoded:
    """What a `produce` function may return instead of bytes: the file's bytes, and how many bytes it wrote
    elsewhere on the way (a channel-state file's new shared segment), counted in `Written.bytes`."""

    data: bytes
    side_bytes: int = 0


@dataclass(frozen=True)
class Written:
    path: str
    bytes: int  # the file's and what its producer wrote beside it (Encoded.side_bytes)
    seconds: float  # producing (encoding, side writes) and writing
    checksum: dict[str, int]  # CRC-32 and size, recorded in `_metadata` so a restore can verify the file


class CheckpointWriter:
    def __init__(self, *, max_pending: int = 64) -> None:
        self._queue: queue.Queue[tuple[str, Callable[[], bytes | Encoded], asyncio.Future[Written],
                                       asyncio.AbstractEventLoop] | None] = queue.Queue()
        self._slots = asyncio.Semaphore(max_pending)
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()
        self.bytes_written = 0
        self.files_written = 0
        self.seconds_busy = 0.0  # time spent producing and writing, over the worker's life

    async def write(self, path: str, produce: Callable[[], bytes | Encoded]) -> Written:
        """Persist `produce()` at `path` durably; waits for a free slot, never blocks the loop."""
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Written] = loop.create_future()
        self._queue.put((path, produce, fut, loop))
        try:
            return await fut
        finally:
            self._slots.release()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            path, produce, fut, loop = item
            t0 = time.monotonic()
            try:
                produced = produce()
                data, side = (produced.data, produced.side_bytes) if isinstance(produced, Encoded) else (produced, 0)
                _durable_write(path, data)
                seconds = time.monotonic() - t0
                result: Written | BaseException = Written(path, len(data) + side, seconds, checksum(data))
                self.bytes_written += len(data) + side
                self.files_written += 1
                self.seconds_busy += seconds
            except BaseException as exc:  # handed to the waiting task
                result = exc
            loop.call_soon_threadsafe(_resolve, fut, result)


def _resolve(fut: asyncio.Future[Written], result: Written | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


def _durable_write(path: str, data: bytes) -> None:
    objectstore.write(path, data)
