"""The state backend interface: batched reads and writes of keyed state, and snapshots of it.

An entry is addressed by (state name, key group, key). Operations come in
batches because the asynchronous execution model sends one batch per round
trip (runtime/execution/async_controller.py); a synchronous caller passes
batches of one. Reads return `MISSING` for absent entries, so `None` stays a
value like any other.

A snapshot has two parts, as in Flink: `begin_snapshot` is the synchronous
part, run at the barrier while processing waits (it must take milliseconds
whatever the state size), and `PendingSnapshot.upload` is the asynchronous
part, which may run on another thread while processing goes on and returns a
`SnapshotHandle` naming the files it wrote.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.state.files import SnapshotStore


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""What a read returns for an entry that does not exist."""

StateAddress = tuple[str, int, Any]  # (state name, key group, key)


class StateBackendError(RuntimeError):
    """The backend failed (I/O, a corrupt or missing snapshot file); the message says which file or entry."""


@dataclass(frozen=True)
class SharedFile:
    """A file several checkpoints may reference: `name` under the store's shared directory."""

    local_name: str  # the name inside the backend's working directory (an SST file name)
    name: str
    size: int
    crc32: int | None = None  # of its bytes, checked before a restore (None: written before checksums)


@dataclass(frozen=True)
class SnapshotHandle:
    """What a snapshot wrote: enough to restore it, to account its size, and to discard it.

    `private_files` belong to this checkpoint alone (paths relative to the
    store's root); `shared_files` may be referenced by later checkpoints too
    and are deleted only when no retained handle references them (see
    runtime/state/files.py SharedFileRegistry).
    """

    backend: str
    checkpoint_id: int
    key_groups: range
    private_files: tuple[str, ...]
    shared_files: tuple[SharedFile, ...] = ()
    uploaded_bytes: int = 0  # what this checkpoint copied; the rest was already in the store
    total_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "checkpoint_id": self.checkpoint_id,
                "key_groups": [self.key_groups.start, self.key_groups.stop],
                "private_files": list(self.private_files),
                "shared_files": [[f.local_name, f.name, f.size, *([] if f.crc32 is None else [f.crc32])]
                                 for f in self.shared_files],
                "uploaded_bytes": self.uploaded_bytes, "total_bytes": self.total_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotHandle:
        try:
            start, stop = data["key_groups"]
            return cls(backend=str(data["backend"]), checkpoint_id=int(data["checkpoint_id"]),
                       key_groups=range(int(start), int(stop)),
                       private_files=tuple(str(p) for p in data["private_files"]),
                       shared_files=tuple(_shared_file(entry) for entry in data["shared_files"]),
                       uploaded_bytes=int(data.get("uploaded_bytes", 0)),
                       total_bytes=int(data.get("total_bytes", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise StateBackendError(f"snapshot handle {data!r:.200} is malformed: {e}") from e


def _shared_file(entry: Any) -> SharedFile:
    """[local name, name, size] or, with its checksum, [local name, name, size, crc32]."""
    if len(entry) not in (3, 4):
        raise ValueError(f"a shared file is [local name, name, size(, crc32)], not {entry!r}")
    crc = int(entry[3]) if len(entry) == 4 else None
    for name in entry[:2]:  # both are file names (local, shared): a path could reach outside either directory
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"a shared file's names are plain file names, not {str(name)[:200]!r}")
    return SharedFile(str(entry[0]), str(entry[1]), int(entry[2]), crc)


class PendingSnapshot(abc.ABC):
    """A snapshot whose synchronous part is done; `upload` writes its files (any thread). With `share` it may
    reference files an earlier snapshot uploaded to the same store; without, it uploads every file (a full
    checkpoint: the store lost files an earlier one named)."""

    checkpoint_id: int
    sync_seconds: float

    @abc.abstractmethod
    def upload(self, store: SnapshotStore, *, share: bool = True) -> SnapshotHandle: ...

    def abort(self) -> None:  # noqa: B027 - a snapshot with no local files has nothing to drop
        """Drop the snapshot without uploading (the checkpoint was declined)."""
        return None


@dataclass
class BackendStatistics:
    reads: int = 0
    writes: int = 0
    deletes: int = 0
    round_trips: int = 0
    snapshots: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class StateBackend(abc.ABC):
    """Keyed state of one task over its key-group range."""

    name: str = "abstract"

    def __init__(self, key_groups: range) -> None:
        self.key_groups = key_groups
        self._stats = BackendStatistics()

    def statistics(self) -> BackendStatistics:
        return self._stats

    @abc.abstractmethod
    def get_many(self, addresses: Sequence[StateAddress]) -> list[Any]:
        """The values at `addresses`, in order; MISSING where there is none."""

    @abc.abstractmethod
    def put_many(self, entries: Sequence[tuple[str, int, Any, Any]]) -> None:
        """Write (name, key group, key, value) entries; later entries win over earlier ones."""

    @abc.abstractmethod
    def delete_many(self, addresses: Sequence[StateAddress]) -> None:
        """Remove the entries; absent ones are ignored."""

    def write_many(self, puts: Sequence[tuple[str, int, Any, Any]], deletes: Sequence[StateAddress]) -> None:
        """Puts and deletes of distinct addresses in one round trip (atomically where the backend can)."""
        self.put_many(puts)
        self.delete_many(deletes)

    # One entry at a time: what a synchronous keyed operator does per record (runtime/state/tables.py). The
    # defaults are batches of one; a local backend overrides them to skip building a batch per call.

    def get_one(self, name: str, group: int, key: Any) -> Any:
        return self.get_many(((name, group, key),))[0]

    def put_one(self, name: str, group: int, key: Any, value: Any) -> None:
        self.put_many(((name, group, key, value),))

    def delete_one(self, name: str, group: int, key: Any) -> None:
        self.delete_many(((name, group, key),))

    @abc.abstractmethod
    def scan(self, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
        """Every (name, key group, key, value) in `key_groups`, ordered by key group."""

    @abc.abstractmethod
    def begin_snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        """The synchronous part of a snapshot: freeze what the checkpoint will hold."""

    def snapshot(self, checkpoint_id: int, store: SnapshotStore) -> SnapshotHandle:
        """Both parts at once (tests, tools)."""
        return self.begin_snapshot(checkpoint_id).upload(store)

    @abc.abstractmethod
    def restore(self, store: SnapshotStore, handles: Sequence[SnapshotHandle]) -> None:
        """Replace this backend's contents with the entries of `handles` inside `self.key_groups`.

        Several handles when subtasks merge on rescale; a handle may cover more
        groups than this backend owns when a subtask splits.
        """

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        return None

    def __enter__(self) -> StateBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_groups(backend: StateBackend, groups: Sequence[int]) -> None:
    """Refuse entries outside the backend's key groups: a routing bug, never to be stored silently."""
    kg = backend.key_groups
    for g in groups:
        if g not in kg:
            raise StateBackendError(f"{backend.name} backend for key groups [{kg.start}, {kg.stop}) "
                                    f"got an entry of key group {g}")
