"""Incremental channel state: which captured buffers a checkpoint writes, and which it references (pure, no I/O).

Under sustained backpressure an unaligned checkpoint captures, checkpoint after checkpoint, many of the same
queued buffers (the consumer drains them slower than checkpoints come). Like RocksDB's shared SST files, a
buffer's bytes are written once, into a *segment* (one shared file per task, checkpoint and side, in
`<job dir>/shared/`), and every later checkpoint that captures the same buffer again references that range of
the segment instead of writing it again.

A channel's state is a list of *pieces*, concatenated on restore: inline bytes (the head a channel reader held
unprocessed, a producer's continued record) or `Ref(segment, offset, length)` ranges. A segment holds whole
buffers, so a buffer cut at the last whole record in one checkpoint can be referenced whole in the next.

Buffers are identified by the caller's key: the worker passes the buffer objects themselves, compared by
identity (a buffer is immutable and stays the same object while it waits in a queue; sequence numbers are
not assigned to a producer's buffers before they are sent). A key stays valid because the tracker holds the
keys it may reuse: the buffers of the base capture and of pending ones, no more than those checkpoints' channel
state.

Safety of references (checked by tests/unit/test_channel_segments.py over random histories):
- A checkpoint references only segments of the newest checkpoint this task knows *completed*, and only if the
  task has captured nothing newer since (`begin` of every snapshot counts, aligned and savepoint ones too).
  That checkpoint is retained until a newer one completes, and any newer one that captured the same buffer
  references the same range (queues are FIFO), so what an in-progress checkpoint references stays on storage.
- Savepoints are self-contained: inline pieces only, and they never become a base.
- A full checkpoint (CheckpointOptions.full: storage lost files) references nothing of its base: it writes every
  buffer into its own segment, and may become the base of the next.
- An aborted checkpoint's segments are referenced by nothing completed: the coordinator deletes them with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Ref:
    segment: str  # file name in the job's shared directory
    offset: int
    length: int


Piece = bytes | Ref


@dataclass(frozen=True, slots=True)
class ChannelCapture:
    """One channel's captured state: `head` (inline), then the bytes of `buffers` from offset `skip` into their
    concatenation (a producer's first buffers may continue a record stored whole in `head`)."""

    head: bytes
    buffers: Sequence[tuple[Hashable, bytes]]
    skip: int = 0


@dataclass
class Capture:
    """What one side (`in` or `out`) of a task's checkpoint writes: the new segment's bytes, in order, and each
    channel's pieces (not yet cut at the last whole record: see `truncate`)."""

    segment: str | None
    new_parts: list[bytes]
    pieces: dict[str, list[Piece]]

    @property
    def new_bytes(self) -> int:
        return sum(len(p) for p in self.new_parts)


@dataclass
class _Snapshot:
    savepoint: bool
    full: bool = False  # references nothing of the base
    refs: dict[Hashable, Ref] = field(default_factory=dict)  # every buffer captured, where its bytes are


class SegmentTracker:
    """One task's record of which buffer bytes are where. `begin` at every snapshot, `capture` per side,
    `completed` / `aborted` from the coordinator's notifications. Runs on the task's thread."""

    def __init__(self, name: str, *, incremental: bool = True) -> None:
        self.name = name  # a prefix that makes segment names unique: the task and a per-attempt token
        self.incremental = incremental
        self._base: dict[Hashable, Ref] = {}
        self._base_id = -1
        self._pending: dict[int, _Snapshot] = {}
        self._newest_begun = -1

    def begin(self, checkpoint_id: int, *, savepoint: bool, full: bool = False) -> None:
        self._pending.setdefault(checkpoint_id, _Snapshot(savepoint, full))
        self._newest_begun = max(self._newest_begun, checkpoint_id)

    def capture(self, checkpoint_id: int, side: str, channels: dict[str, ChannelCapture]) -> Capture:
        snap = self._pending.get(checkpoint_id)
        if snap is None:  # a capture without begin (defensive): it is a snapshot of its own
            self.begin(checkpoint_id, savepoint=False)
            snap = self._pending[checkpoint_id]
        shared = self.incremental and not snap.savepoint
        base = {} if snap.full else self._base
        segment = f"chan-{checkpoint_id}-{self.name}-{side}.seg" if shared else None
        new_parts: list[bytes] = []
        written = 0
        pieces: dict[str, list[Piece]] = {}
        for key, ch in channels.items():
            out: list[Piece] = [ch.head] if ch.head else []
            skip = ch.skip
            for buffer_key, data in ch.buffers:
                if skip >= len(data):
                    skip -= len(data)
                    continue
                if segment is None:
                    out.append(data[skip:])
                    skip = 0
                    continue
                ref = base.get(buffer_key) or snap.refs.get(buffer_key)
                if ref is None:
                    ref = Ref(segment, written, len(data))
                    new_parts.append(data)
                    written += len(data)
                snap.refs[buffer_key] = ref
                _append(out, Ref(ref.segment, ref.offset + skip, ref.length - skip))
                skip = 0
            pieces[key] = out
        return Capture(segment if new_parts else None, new_parts, pieces)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: its captures may become the base of the next checkpoint."""
        snap = self._pending.pop(checkpoint_id, None)
        for older in [n for n in self._pending if n < checkpoint_id]:
            del self._pending[older]  # subsumed: it will never complete
        if checkpoint_id <= self._base_id:
            return
        self._base_id = checkpoint_id
        usable = snap is not None and not snap.savepoint and checkpoint_id >= self._newest_begun
        self._base = snap.refs if usable and snap is not None else {}

    def aborted(self, checkpoint_id: int) -> None:
        self._pending.pop(checkpoint_id, None)

    def referenced(self) -> set[str]:
        """Segments the base and pending captures reference (for tests and statistics)."""
        out = {r.segment for r in self._base.values()}
        for snap in self._pending.values():
            out.update(r.segment for r in snap.refs.values())
        return out


def _append(pieces: list[Piece], ref: Ref) -> None:
    """Append `ref`, merging it into the previous piece when it continues the same segment."""
    if pieces:
        last = pieces[-1]
        if isinstance(last, Ref) and last.segment == ref.segment and last.offset + last.length == ref.offset:
            pieces[-1] = Ref(last.segment, last.offset, last.length + ref.length)
            return
    if ref.length > 0:
        pieces.append(ref)


def truncate(pieces: list[Piece], length: int) -> list[Piece]:
    """The pieces cut to their first `length` bytes (a consumer's state ends at its last whole record)."""
    out: list[Piece] = []
    left = length
    for piece in pieces:
        if left <= 0:
            break
        size = piece.length if isinstance(piece, Ref) else len(piece)
        if size <= left:
            out.append(piece)
        elif isinstance(piece, Ref):
            out.append(Ref(piece.segment, piece.offset, left))
        else:
            out.append(piece[:left])
        left -= min(size, left)
    return out


def pieces_length(pieces: Sequence[Piece]) -> int:
    return sum(p.length if isinstance(p, Ref) else len(p) for p in pieces)


def segments_of(pieces: dict[str, list[Piece]]) -> set[str]:
    return {p.segment for ps in pieces.values() for p in ps if isinstance(p, Ref)}


def resolve(pieces: Sequence[Piece], segments: dict[str, bytes]) -> bytes:
    """The channel's bytes, given the contents of the segments its pieces name; KeyError names a missing one,
    ValueError a range outside its segment."""
    parts = []
    for piece in pieces:
        if isinstance(piece, Ref):
            data = segments[piece.segment]
            if piece.offset < 0 or piece.offset + piece.length > len(data):
                raise ValueError(f"range {piece.offset}+{piece.length} outside segment {piece.segment} "
                                 f"({len(data)} bytes)")
            parts.append(data[piece.offset:piece.offset + piece.length])
        else:
            parts.append(piece)
    return b"".join(parts)
