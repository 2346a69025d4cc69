"""The in-memory state backend: dictionaries by key group.

The synchronous part of a snapshot copies the dictionaries of each group (a
shallow copy: values are immutable once written, since every write replaces
the value); the asynchronous part encodes them into one private file. Every
checkpoint holds the whole state: there is nothing incremental about memory.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgpack

from runtime.common import objectstore
from runtime.common.values import packer_default, unpack_ext
from runtime.state.backend import (
    MISSING,
    PendingSnapshot,
    SnapshotHandle,
    StateAddress,
    StateBackend,
    StateBackendError,
    check_groups,
)
from runtime.state.codec import hashable
from runtime.state.files import SnapshotStore

FORMAT = 1
_DEFAULT = packer_default("a memory state snapshot")


class MemoryBackend(StateBackend):
    name = "memory"

    def __init__(self, key_groups: range) -> None:
        super().__init__(key_groups)
        self._groups: dict[int, dict[tuple[str, Any], Any]] = {}
        self._owner = uuid.uuid4().hex[:12]
        # batches run on a worker thread while the snapshot's copy runs on the event loop's
        self._lock = threading.Lock()

    def get_many(self, addresses: Sequence[StateAddress]) -> list[Any]:
        self._stats.reads += len(addresses)
        self._stats.round_trips += 1
        out = []
        with self._lock:
            for name, group, key in addresses:
                table = self._groups.get(group)
                out.append(MISSING if table is None else table.get((name, key), MISSING))
        return out

    def put_many(self, entries: Sequence[tuple[str, int, Any, Any]]) -> None:
        check_groups(self, [e[1] for e in entries])
        self._stats.writes += len(entries)
        self._stats.round_trips += 1
        with self._lock:
            for name, group, key, value in entries:
                self._groups.setdefault(group, {})[(name, key)] = value

    def write_many(self, puts: Sequence[tuple[str, int, Any, Any]], deletes: Sequence[StateAddress]) -> None:
        self.put_many(puts)
        self.delete_many(deletes)
        self._stats.round_trips -= 1  # one round trip for both

    def delete_many(self, addresses: Sequence[StateAddress]) -> None:
        self._stats.deletes += len(addresses)
        self._stats.round_trips += 1
        with self._lock:
            for name, group, key in addresses:
                table = self._groups.get(group)
                if table is not None:
                    table.pop((name, key), None)
                    if not table:
                        del self._groups[group]

    def scan(self, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
        with self._lock:
            frozen = {g: list(t.items()) for g, t in self._groups.items() if g in key_groups}
        for group in sorted(frozen):
            for (name, key), value in frozen[group]:
                yield name, group, key, value

    def entries(self) -> int:
        return sum(len(t) for t in self._groups.values())

    def begin_snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        started = time.perf_counter()
        with self._lock:
            frozen = {group: dict(table) for group, table in self._groups.items()}
        self._stats.snapshots += 1
        return _MemorySnapshot(checkpoint_id, self.key_groups, frozen, self._owner, time.perf_counter() - started)

    def restore(self, store: SnapshotStore, handles: Sequence[SnapshotHandle]) -> None:
        groups: dict[int, dict[tuple[str, Any], Any]] = {}
        for handle in handles:
            if handle.backend != self.name:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id} was taken by the {handle.backend} "
                                        f"backend; the memory backend cannot restore it")
            for relative in handle.private_files:
                for name, group, key, value in _read_tables(store, relative):
                    if group in self.key_groups:
                        groups.setdefault(group, {})[(name, key)] = value
        self._groups = groups


class _MemorySnapshot(PendingSnapshot):
    def __init__(self, checkpoint_id: int, key_groups: range, frozen: dict[int, dict[tuple[str, Any], Any]],
                 owner: str, sync_seconds: float) -> None:
        self.checkpoint_id = checkpoint_id
        self.sync_seconds = sync_seconds
        self._key_groups = key_groups
        self._frozen = frozen
        self._owner = owner

    def upload(self, store: SnapshotStore, *, share: bool = True) -> SnapshotHandle:  # its files are private
        tables = {group: [[name, key, value] for (name, key), value in table.items()]
                  for group, table in self._frozen.items()}
        data = msgpack.packb({"format": FORMAT, "groups": tables}, use_bin_type=True, default=_DEFAULT)
        relative = f"{objectstore.basename(store.private_dir(self.checkpoint_id))}/{self._owner}-memory.state"
        store.write(relative, data)
        return SnapshotHandle(backend=MemoryBackend.name, checkpoint_id=self.checkpoint_id,
                              key_groups=self._key_groups, private_files=(relative,),
                              uploaded_bytes=len(data), total_bytes=len(data))


def _read_tables(store: SnapshotStore, relative: str) -> Iterator[tuple[str, int, Any, Any]]:
    path = store.path(relative)
    try:
        data = msgpack.unpackb(store.read(relative), raw=False, strict_map_key=False, ext_hook=unpack_ext)
        if data.get("format") != FORMAT:
            raise StateBackendError(f"{path}: memory state format {data.get('format')!r}, expected {FORMAT}")
        for group, entries in data["groups"].items():
            for name, key, value in entries:
                yield name, int(group), hashable(key), value
    except FileNotFoundError as e:
        raise StateBackendError(f"{path}: memory state snapshot file is missing") from e
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
        raise StateBackendError(f"{path}: memory state snapshot does not decode: {e}") from e


def create(key_groups: range, *, work_dir: str, options: Mapping[str, Any]) -> MemoryBackend:
    """The descriptor's factory (runtime/common/state_backends.py): nothing to configure."""
    return MemoryBackend(key_groups)
