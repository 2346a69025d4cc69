"""A task's channel-state files with incremental segments: the I/O shell around channel_segments.py.

The task's checkpointer hands over, per channel, the captured buffers (`input_capture`, `output_capture`: no
bytes are joined on the task's turn); `produce` returns the function the checkpoint writer thread runs: it
writes the new segment (the buffers no earlier completed checkpoint holds) to `<job dir>/shared/`, then
returns the `.in` / `.out` file, whose channels are pieces (inline bytes or segment ranges) and which records
every segment it names with its CRC-32. The task's acknowledgement lists the same segments (`segments`:
`[name, size, crc32]`), so `_metadata` names every file a checkpoint needs and the coordinator keeps a segment
while a retained checkpoint lists it (coordinator/storage.py). Savepoints are written inline, self-contained.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable
from typing import Any

from netstack.credit import Buffer
from runtime.checkpointing.channel_segments import (
    ChannelCapture,
    Piece,
    SegmentTracker,
    segments_of,
    truncate,
)
from runtime.checkpointing.snapshots import encode_channel_pieces, segment_path
from runtime.checkpointing.writer import Encoded
from runtime.common import objectstore
from runtime.common.checksums import checksum
from runtime.execution.channels import whole_records_length


class _Same:
    """A buffer as a key by identity: the same object while it waits in a queue. Holding it keeps its id valid."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer

    def __hash__(self) -> int:
        return id(self.buffer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.buffer is self.buffer


def _keyed(buffers: list[Buffer]) -> list[tuple[Hashable, bytes]]:
    return [(_Same(b), b.data) for b in buffers]


def input_capture(prefix: bytes, buffers: list[Buffer]) -> tuple[ChannelCapture, Callable[[], int]]:
    """A consumer channel's state: the reader's unprocessed bytes, then the recorded buffers, and the function
    (run on the writer thread, once the buffers are final) giving its length cut at the last whole record."""
    return ChannelCapture(prefix, _keyed(buffers)), lambda: whole_records_end(prefix, buffers)


def output_capture(overtaken: list[Buffer]) -> ChannelCapture | None:
    """A producer channel's state: the buffers a priority barrier overtook; when the first begins inside a
    record (its head already sent), that record whole first and the buffers from the next record start on
    (the same bytes as execution.channels.overtaken_records)."""
    if not overtaken:
        return None
    head = overtaken[0].continued_record
    if head is None:
        return ChannelCapture(b"", _keyed(overtaken))
    skip = 0
    for buffer in overtaken:
        if buffer.first_record_offset >= 0:
            skip += buffer.first_record_offset
            break
        skip += len(buffer.data)
    return ChannelCapture(head, _keyed(overtaken), skip)


def whole_records_end(prefix: bytes, buffers: list[Buffer]) -> int:
    """len(execution.channels.whole_records(prefix, buffers)), scanning only from the last record start a
    buffer declares."""
    position = len(prefix) + sum(len(b.data) for b in buffers)
    for index in range(len(buffers) - 1, -1, -1):
        buffer = buffers[index]
        position -= len(buffer.data)
        if buffer.first_record_offset >= 0:
            tail = buffer.data[buffer.first_record_offset:] + b"".join(b.data for b in buffers[index + 1:])
            return position + buffer.first_record_offset + whole_records_length(tail)
    return whole_records_length(prefix + b"".join(b.data for b in buffers))


class ChannelStateFiles:
    """One task's channel-state files. `begin`, `produce`, `completed`, `aborted` and `segments` run on the
    task's turn; the functions `produce` returns run on the writer thread, and everything they record is read
    only after their write resolved (the acknowledgement waits for it)."""

    def __init__(self, task_key: str, *, incremental: bool = True) -> None:
        # a token per task attempt: segment names never collide with an earlier attempt's
        name = f"{task_key.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
        self.tracker = SegmentTracker(name, incremental=incremental)
        self._sums: dict[str, dict[str, int]] = {}  # segment -> checksum, of every segment written or known
        self._used: dict[int, set[str]] = {}  # checkpoint -> segments its files reference

    def begin(self, checkpoint_id: int, *, savepoint: bool, full: bool = False) -> None:
        self.tracker.begin(checkpoint_id, savepoint=savepoint, full=full)

    def produce(self, directory: str, checkpoint_id: int, kind: str, channels: dict[str, ChannelCapture],
                ends: dict[str, Callable[[], int]] | None = None) -> Callable[[], Encoded]:
        capture = self.tracker.capture(checkpoint_id, kind, channels)
        used = self._used.setdefault(checkpoint_id, set())
        sums = self._sums

        def run() -> Encoded:  # on the writer thread
            pieces: dict[str, list[Piece]] = {}
            for key, ps in capture.pieces.items():
                if ends is not None and key in ends:
                    ps = truncate(ps, ends[key]())
                if ps:
                    pieces[key] = ps
            written = 0
            if capture.segment is not None:
                data = b"".join(capture.new_parts)
                objectstore.write(segment_path(directory, capture.segment), data)
                sums[capture.segment] = checksum(data)
                written = len(data)
            names = segments_of(pieces)
            used.update(names)
            return Encoded(encode_channel_pieces(kind, pieces, {n: sums[n] for n in names}), written)

        return run

    def segments(self, checkpoint_id: int) -> list[list[Any]]:
        """`[name, size, crc32]` of every segment checkpoint `checkpoint_id`'s files reference (for its ack)."""
        return [[n, self._sums[n]["size"], self._sums[n]["crc32"]] for n in sorted(self._used.get(checkpoint_id, ()))]

    def completed(self, checkpoint_id: int) -> None:
        self.tracker.completed(checkpoint_id)
        self._forget(checkpoint_id)

    def aborted(self, checkpoint_id: int) -> None:
        self.tracker.aborted(checkpoint_id)
        self._used.pop(checkpoint_id, None)

    def _forget(self, checkpoint_id: int) -> None:
        for n in [n for n in self._used if n <= checkpoint_id]:
            del self._used[n]
        live = self.tracker.referenced() | {s for used in list(self._used.values()) for s in list(used)}
        for name in list(self._sums):  # a copy: the writer thread may add a segment meanwhile
            if name not in live:
                self._sums.pop(name, None)
