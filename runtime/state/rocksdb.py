"""The embedded RocksDB state backend, with incremental checkpoints (needs the `rocksdb` extra).

Entries live in one RocksDB instance per task in a local working directory,
keyed as runtime/state/codec.py describes (key group first), so a key-group
range is one range scan and clipping a restored instance to fewer groups is
two range deletions.

A checkpoint's synchronous part is a RocksDB checkpoint: a memtable flush and
hard links of the immutable SST files, so its cost is bounded by the memtable
size (`write_buffer_bytes`), not by the state size. The asynchronous part
uploads (into the SnapshotStore: a local directory or an object store) the SST files the previous checkpoint
of this backend did not upload, referencing the others by their shared name,
plus the small private files (MANIFEST, CURRENT, OPTIONS, WAL). SST files are
named `<instance>-<local name>` in the store: local names repeat across
instances and restores, the instance id does not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from runtime.common import objectstore
from runtime.common.checksums import file_crc32
from runtime.common.extras import install_line
from runtime.state.backend import (
    MISSING,
    PendingSnapshot,
    SharedFile,
    SnapshotHandle,
    StateAddress,
    StateBackend,
    StateBackendError,
    check_groups,
)
from runtime.state.codec import (
    MAX_KEY_GROUPS,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    group_prefix,
    range_bounds,
)
from runtime.state.files import SnapshotStore, shared_relative

try:
    import rocksdict
except ImportError:  # pragma: no cover - depends on the install
    rocksdict = None  # type: ignore[assignment]

DEFAULT_WRITE_BUFFER_BYTES = 8 << 20


def available() -> bool:
    return rocksdict is not None


class RocksDBBackend(StateBackend):
    name = "rocksdb"

    def __init__(self, key_groups: range, *, directory: str,
                 write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES) -> None:
        if rocksdict is None:
            raise StateBackendError("the rocksdb state backend needs the `rocksdb` extra (the rocksdict package); "
                                    f"install it with scripts/bootstrap.sh or `{install_line('rocksdb')}`")
        super().__init__(key_groups)
        self._base = os.path.abspath(directory)
        self._write_buffer_bytes = write_buffer_bytes
        self._uploads = SharedUploads()  # what the snapshots share with the backend, and nothing else of it
        self._snapshot_seq = 0
        self._open_fresh()

    # -- instance lifecycle ---------------------------------------------------------------------------

    def _open_fresh(self) -> None:
        self._instance = uuid.uuid4().hex[:12]
        self._path = os.path.join(self._base, f"db-{self._instance}")
        os.makedirs(self._path)
        self._db = self._open(self._path)

    def _options(self) -> Any:
        assert rocksdict is not None
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(self._write_buffer_bytes)
        # Small files and a small base level: a compaction then rewrites a few small files, not all the
        # state, so an incremental checkpoint after it still uploads little (updates spread over every key
        # group overlap every file of the level they are compacted into).
        options.set_target_file_size_base(self._write_buffer_bytes // 2)
        options.set_max_bytes_for_level_base(self._write_buffer_bytes * 2)
        return options

    def _open(self, path: str) -> Any:
        assert rocksdict is not None
        # No write-ahead log: the instance is disposable (a failed task restores from its last checkpoint), and
        # a RocksDB checkpoint flushes the memtable, so every write before it is in the snapshot's SST files.
        # Writes then cost a memtable insert, not a log append as well.
        self._write_options = rocksdict.WriteOptions()
        self._write_options.disable_wal = True  # type: ignore[assignment,method-assign,unused-ignore]  # a property
        try:
            return rocksdict.Rdict(path, self._options())
        except Exception as e:  # rocksdict raises plain Exception for RocksDB errors
            raise StateBackendError(f"cannot open RocksDB at {path}: {e}") from e

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()
            shutil.rmtree(self._path, ignore_errors=True)
            with contextlib.suppress(OSError):  # a working directory made for this backend alone: now empty
                os.rmdir(self._base)

    @property
    def working_directory(self) -> str:
        return self._path

    # -- reads and writes -----------------------------------------------------------------------------

    def get_many(self, addresses: Sequence[StateAddress]) -> list[Any]:
        self._stats.reads += len(addresses)
        self._stats.round_trips += 1
        if not addresses:
            return []
        raw = self._db.get([encode_key(name, group, key) for name, group, key in addresses])
        return [MISSING if value is None else decode_value(value) for value in raw]

    def put_many(self, entries: Sequence[tuple[str, int, Any, Any]]) -> None:
        self.write_many(entries, ())

    def delete_many(self, addresses: Sequence[StateAddress]) -> None:
        self.write_many((), addresses)

    def write_many(self, puts: Sequence[tuple[str, int, Any, Any]], deletes: Sequence[StateAddress]) -> None:
        assert rocksdict is not None
        check_groups(self, [e[1] for e in puts])
        self._stats.writes += len(puts)
        self._stats.deletes += len(deletes)
        self._stats.round_trips += 1
        batch = rocksdict.WriteBatch(raw_mode=True)
        for name, group, key, value in puts:
            batch.put(encode_key(name, group, key), encode_value(value))
        for name, group, key in deletes:
            batch.delete(encode_key(name, group, key))
        self._db.write(batch, self._write_options)

    def get_one(self, name: str, group: int, key: Any) -> Any:
        self._stats.reads += 1
        self._stats.round_trips += 1
        raw = self._db.get(encode_key(name, group, key))
        return MISSING if raw is None else decode_value(raw)

    def put_one(self, name: str, group: int, key: Any, value: Any) -> None:
        if group not in self.key_groups:
            check_groups(self, (group,))
        self._stats.writes += 1
        self._stats.round_trips += 1
        self._db.put(encode_key(name, group, key), encode_value(value), self._write_options)

    def delete_one(self, name: str, group: int, key: Any) -> None:
        self._stats.deletes += 1
        self._stats.round_trips += 1
        self._db.delete(encode_key(name, group, key), self._write_options)

    def scan(self, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
        yield from _scan(self._db, key_groups)

    # -- snapshots ------------------------------------------------------------------------------------

    def begin_snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        assert rocksdict is not None
        started = time.perf_counter()
        self._snapshot_seq += 1
        local = os.path.join(self._base, f"snapshot-{self._instance}-{self._snapshot_seq}")
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(local)
        except Exception as e:
            shutil.rmtree(local, ignore_errors=True)
            raise StateBackendError(f"RocksDB checkpoint {checkpoint_id} into {local} failed: {e}") from e
        self._stats.snapshots += 1
        return _RocksSnapshot(checkpoint_id, local, instance=self._instance, key_groups=self.key_groups,
                              uploads=self._uploads, sync_seconds=time.perf_counter() - started)

    def restore(self, store: SnapshotStore, handles: Sequence[SnapshotHandle]) -> None:
        for handle in handles:
            if handle.backend != self.name:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id} was taken by the {handle.backend} "
                                        f"backend; the rocksdb backend cannot restore it")
        self.close()
        if len(handles) == 1:
            # One predecessor: open its files as they are and cut away the groups we do not own.
            self._instance = uuid.uuid4().hex[:12]
            self._path = os.path.join(self._base, f"db-{self._instance}")
            _download(store, handles[0], self._path)
            self._db = self._open(self._path)
            self._clip(handles[0].key_groups)
            # The local SST files are byte for byte the shared ones: the next checkpoint need not upload them.
            self._uploads.remember({f.local_name: f for f in handles[0].shared_files}, store.root)
            return
        self._open_fresh()
        self._uploads.remember({}, None)
        for handle in handles:
            overlap = range(max(handle.key_groups.start, self.key_groups.start),
                            min(handle.key_groups.stop, self.key_groups.stop))
            if not overlap:
                continue
            temp = os.path.join(self._base, f"restore-{uuid.uuid4().hex[:12]}")
            try:
                _download(store, handle, temp)
                source = self._open(temp)
                try:
                    self._copy_from(source, overlap)
                finally:
                    source.close()
            finally:
                shutil.rmtree(temp, ignore_errors=True)

    def _clip(self, had: range) -> None:
        own = self.key_groups
        if had.start < own.start:
            self._db.delete_range(group_prefix(had.start), group_prefix(own.start))
        if own.stop < had.stop:
            _, end = range_bounds(range(own.stop, MAX_KEY_GROUPS))
            self._db.delete_range(group_prefix(own.stop), end)

    def _copy_from(self, source: Any, groups: range) -> None:
        assert rocksdict is not None
        batch = rocksdict.WriteBatch(raw_mode=True)
        pending = 0
        start, end = range_bounds(groups)
        for key, value in _raw_items(source, start, end):
            batch.put(key, value)
            pending += 1
            if pending >= 10_000:
                self._db.write(batch, self._write_options)
                batch = rocksdict.WriteBatch(raw_mode=True)
                pending = 0
        if pending:
            self._db.write(batch, self._write_options)


class SharedUploads:
    """The SST files the backend's last snapshot (or restore) has in a store: the one thing a snapshot and its
    backend share. The next snapshot to the same store references those it still has instead of uploading
    them again; one to another store (a savepoint's) copies everything, and so does the checkpoint after it.
    Uploads run on other threads: read and replaced under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, SharedFile] = {}
        self._root: str | None = None  # the store root of those uploads: another store has none of them

    def previous(self, root: str) -> dict[str, SharedFile]:
        """The SST files (by local name) already in the store at `root`."""
        with self._lock:
            return dict(self._files) if self._root == root else {}

    def remember(self, files: dict[str, SharedFile], root: str | None) -> None:
        with self._lock:
            self._files = files
            self._root = root


class _RocksSnapshot(PendingSnapshot):
    def __init__(self, checkpoint_id: int, local: str, *, instance: str, key_groups: range, uploads: SharedUploads,
                 sync_seconds: float) -> None:
        self.checkpoint_id = checkpoint_id
        self.sync_seconds = sync_seconds
        self._local = local  # the RocksDB checkpoint's directory, which the upload consumes
        self._instance = instance  # names the shared files apart from another instance's of the same name
        self._key_groups = key_groups
        self._uploads = uploads

    def upload(self, store: SnapshotStore, *, share: bool = True) -> SnapshotHandle:
        previous = self._uploads.previous(store.root) if share else {}
        private_dir = objectstore.basename(store.private_dir(self.checkpoint_id))
        private: list[str] = []
        shared: dict[str, SharedFile] = {}
        uploaded = total = 0
        try:
            for name in sorted(os.listdir(self._local)):
                source = os.path.join(self._local, name)
                size = os.path.getsize(source)
                total += size
                if name.endswith(".sst"):
                    known = previous.get(name)
                    if known is not None and known.size == size:
                        shared[name] = known
                        continue
                    entry = SharedFile(local_name=name, name=f"{self._instance}-{name}", size=size,
                                       crc32=file_crc32(source))
                    uploaded += store.upload(source, f"shared/{entry.name}")
                    shared[name] = entry
                else:
                    relative = f"{private_dir}/{self._instance}-{name}"
                    uploaded += store.upload(source, relative)
                    private.append(relative)
        except OSError as e:
            raise StateBackendError(f"uploading RocksDB checkpoint {self.checkpoint_id} from {self._local} "
                                    f"failed: {e}") from e
        finally:
            shutil.rmtree(self._local, ignore_errors=True)
        self._uploads.remember(shared, store.root)
        return SnapshotHandle(backend=RocksDBBackend.name, checkpoint_id=self.checkpoint_id,
                              key_groups=self._key_groups, private_files=tuple(private),
                              shared_files=tuple(shared[n] for n in sorted(shared)),
                              uploaded_bytes=uploaded, total_bytes=total)

    def abort(self) -> None:
        shutil.rmtree(self._local, ignore_errors=True)


def _download(store: SnapshotStore, handle: SnapshotHandle, target: str) -> None:
    """Lay a handle's files out as a RocksDB directory at `target`."""
    os.makedirs(target)
    try:
        for f in handle.shared_files:
            relative = shared_relative(f.name)
            if store.size(relative) != f.size:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id}: shared file {store.path(relative)} is "
                                        f"missing or not {f.size} bytes")
            store.download(relative, os.path.join(target, f.local_name))
            if f.crc32 is not None and file_crc32(os.path.join(target, f.local_name)) != f.crc32:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id}: shared file {store.path(relative)} is "
                                        f"corrupt: its CRC-32 differs from the one recorded")
        for relative in handle.private_files:
            local_name = objectstore.basename(relative).split("-", 1)[1]
            try:
                store.download(relative, os.path.join(target, local_name))
            except FileNotFoundError:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id}: private file "
                                        f"{store.path(relative)} is missing") from None
    except OSError as e:
        shutil.rmtree(target, ignore_errors=True)
        raise StateBackendError(f"checkpoint {handle.checkpoint_id}: downloading its files failed: {e}") from e
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _raw_items(db: Any, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
    assert rocksdict is not None
    read = rocksdict.ReadOptions()
    read.set_iterate_upper_bound(end)
    yield from db.items(from_key=start, read_opt=read)


def _scan(db: Any, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
    if not key_groups:
        return
    start, end = range_bounds(key_groups)
    for raw_key, raw_value in _raw_items(db, start, end):
        name, group, key = decode_key(raw_key)
        yield name, group, key, decode_value(raw_value)


def create(key_groups: range, *, work_dir: str, options: Mapping[str, Any]) -> RocksDBBackend:
    """The descriptor's factory (runtime/common/state_backends.py): an instance in `work_dir`, with the
    option `write_buffer_bytes`."""
    os.makedirs(work_dir, exist_ok=True)
    return RocksDBBackend(key_groups, directory=work_dir,
                          write_buffer_bytes=int(options.get("write_buffer_bytes") or DEFAULT_WRITE_BUFFER_BYTES))
