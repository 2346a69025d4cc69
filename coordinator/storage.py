"""Where checkpoints live: directory layout and the atomic `_metadata` file.

`CheckpointStorage` is the interface the coordinator uses; `LocalCheckpointStorage`
implements it on a local (or mounted, shared) filesystem and on an S3-compatible
object store alike: the root and every path may be an `s3://bucket/prefix` URL,
and all I/O goes through runtime/common/objectstore.py, which picks the backend
from the path (the workers write their task files through it too). Layout:

    <root>/checkpoints/<job-id>/chk-<n>/_metadata     checkpoints
    <directory>/savepoint-<job-id>-<n>/_metadata      savepoints, in a directory given per request

`_metadata` is written last and atomically, so a directory without it is not
a completed checkpoint and is ignored (it is what a crash mid-checkpoint
leaves behind). On an object store it is created with a conditional PUT and
never overwritten; every task file was uploaded before (a worker acks only
after its uploads finished). Format 2 carries a CRC-32 and size of every task file (in
each ack's `state.checksums`) and a `checksum` of its own body (the document
without that field, serialised as written), so `verify` finds a flipped bit
anywhere in a checkpoint before it is restored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.common import objectstore as files
from runtime.common import retention
from runtime.common.checkpoint_metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    BadMetadata,
    encode_metadata,
    shape_problem,
    write_metadata_file,
)
from runtime.common.checksums import CorruptFile, read_checked
from runtime.graph.checkpoint_metadata import CheckpointMetadata, read_checkpoint_metadata

SHARED_DIR = "shared"  # files later checkpoints reference again (RocksDB SST files, channel-state segments)

TASK_FILES = ("state", "in", "out")  # the keys of an ack's state that name a file in the checkpoint
_CHECKPOINT_DIR = re.compile(r"chk-(\d+)")


class CorruptCheckpoint(CorruptFile):
    """A checkpoint or savepoint whose `_metadata` is missing or cannot be used; the message names the path."""


class CheckpointStorage(Protocol):
    def checkpoint_dir(self, job_id: str, n: int) -> str: ...

    def savepoint_dir(self, directory: str, job_id: str, n: int) -> str: ...

    def write_metadata(self, directory: str, metadata: CheckpointMetadata | Mapping[str, Any]) -> str: ...

    def read_metadata(self, path: str) -> CheckpointMetadata: ...

    def directory_of(self, path: str) -> str: ...

    def verify(self, path: str, metadata: CheckpointMetadata) -> None: ...

    def missing_files(self, directory: str, metadata: CheckpointMetadata) -> list[str]: ...

    def list_completed(self, job_id: str) -> list[tuple[int, str]]: ...

    def latest(self, job_id: str) -> tuple[int, str] | None: ...

    def record_retained(self, job_id: str, retained: list[int]) -> None: ...

    def discard(self, path: str) -> None: ...

    def sweep_shared(self, job_id: str) -> int: ...


def check_shape(metadata: Any) -> str | None:
    """What is wrong with a metadata document (its format, then CheckpointMetadata's fields), or None."""
    problem = shape_problem(metadata)
    if problem is not None:
        return problem
    try:
        CheckpointMetadata.from_document(metadata)
    except ValueError as exc:
        return str(exc)
    return None


class LocalCheckpointStorage:
    """Checkpoints under `root`: a local directory or an `s3://bucket/prefix` URL (the name is historical)."""

    def __init__(self, root: str, *, subdirectory: str = "checkpoints") -> None:
        self.root = files.absolute(root)
        # the job directories go in root/subdirectory; "" puts them in root itself (a --checkpoint-dir)
        self.subdirectory = subdirectory
        if files.is_url(self.root):
            files.split_url(self.root)  # a URL without a bucket is one clear error at start-up

    def job_dir(self, job_id: str) -> str:
        return files.join(self.root, self.subdirectory, _safe_name(job_id))

    def checkpoint_dir(self, job_id: str, n: int) -> str:
        """`<root>/<subdirectory>/<job-id>/chk-<n>/`, created if needed."""
        path = files.join(self.job_dir(job_id), f"chk-{_check_number(n)}")
        files.make_dir(path)
        return path

    def savepoint_dir(self, directory: str, job_id: str, n: int) -> str:
        """`<directory>/savepoint-<job-id>-<n>/`, created if needed."""
        path = files.join(files.absolute(directory), f"savepoint-{_safe_name(job_id)}-{_check_number(n)}")
        files.make_dir(path)
        return path

    def write_metadata(self, directory: str, metadata: CheckpointMetadata | Mapping[str, Any]) -> str:
        """Write `<directory>/_metadata` atomically and durably; returns its path.

        Local: temp file in the same directory, fsync, rename over `_metadata`, fsync of the directory: after a
        crash the file is either absent or complete. Object store: one conditional PUT that never replaces an
        existing `_metadata` (a second write of the same checkpoint fails with FileExistsError).
        """
        typed = isinstance(metadata, CheckpointMetadata)  # checked when it was built: not parsed again
        doc = {"format": FORMAT_VERSION, **(metadata.to_document() if isinstance(metadata, CheckpointMetadata)
                                            else metadata)}
        problem = None if typed else check_shape(doc)
        if problem is not None:
            raise ValueError(f"refusing to write checkpoint metadata to {directory}: {problem}")
        # Serialise before touching the disk, so unserialisable state leaves nothing behind.
        return write_metadata_file(directory, encode_metadata(doc))

    def directory_of(self, path: str) -> str:
        """A checkpoint's directory (absolute), given the directory or its `_metadata` file."""
        if files.is_url(path):
            return files.dirname(path) if files.basename(path) == METADATA_FILE else files.absolute(path)
        return os.path.abspath(path if os.path.isdir(path) else os.path.dirname(path))

    def read_metadata(self, path: str) -> CheckpointMetadata:
        """A checkpoint's metadata, given its directory or its `_metadata` file: the one reader
        (runtime/graph/checkpoint_metadata.py), its problems as CorruptCheckpoint naming the file."""
        try:
            return read_checkpoint_metadata(path)
        except BadMetadata as exc:
            raise CorruptCheckpoint(str(exc)) from None

    def verify(self, path: str, metadata: CheckpointMetadata) -> None:
        """Check every file the metadata names against what it recorded (the CRC-32 and size of a task file, a
        shared state file or a channel-state segment; a backend's private file exists); raises CorruptCheckpoint
        naming the first file that is missing or differs. Every name is confined to the store it belongs to
        before anything is looked at."""
        directory = files.dirname(path) if files.basename(path) == METADATA_FILE else path
        for named in named_files(metadata):
            _verify_file(directory, named)

    def missing_files(self, directory: str, metadata: CheckpointMetadata) -> list[str]:
        """The files the metadata names that storage does not hold, by one listing per directory (no reads):
        the runner writes `_metadata` only when none is missing, so storage that lost files under a running job
        (a wiped or expired bucket) never yields a completed checkpoint naming them. `verify` checks contents
        before a restore."""
        wanted: dict[str, set[str]] = {}
        for named in named_files(metadata):
            path = files.join(named.parent(directory), str(named.name))
            wanted.setdefault(files.dirname(path), set()).add(files.basename(path))
        missing = []
        for parent, expected in sorted(wanted.items()):
            missing += [files.join(parent, n) for n in sorted(expected - set(files.list_children(parent)))]
        return missing

    def list_completed(self, job_id: str) -> list[tuple[int, str]]:
        """(n, path) of every `chk-<n>` directory with a `_metadata` file, by n."""
        job_dir = self.job_dir(job_id)
        found = []
        for name in files.list_children(job_dir):
            m = _CHECKPOINT_DIR.fullmatch(name)
            path = files.join(job_dir, name)
            if m and files.exists(files.join(path, METADATA_FILE)):
                found.append((int(m.group(1)), path))
        return sorted(found)

    def latest(self, job_id: str) -> tuple[int, str] | None:
        completed = self.list_completed(job_id)
        return completed[-1] if completed else None

    def record_retained(self, job_id: str, retained: list[int]) -> None:
        """Write the job's `_retained` record: the completed checkpoints the coordinator keeps. Call it after a
        checkpoint completes and before the checkpoints it retires are discarded; the remote state backend's
        garbage collection keeps the versions of exactly these (runtime/common/retention.py)."""
        retention.write(self.job_dir(job_id), retained)

    def discard(self, path: str) -> None:
        """Remove a checkpoint or savepoint directory; a missing one is fine."""
        name = files.basename(path)
        if not (name.startswith("chk-") or name.startswith("savepoint-")):
            # rmtree on a wrong path would be a disaster; only ever delete what this module names.
            raise ValueError(f"refusing to discard {path}: not a checkpoint or savepoint directory")
        released = self._shared_files_of(path) if name.startswith("chk-") else set()
        # _metadata goes first: if the removal stops half-way, what remains is not a completed checkpoint.
        files.remove_tree(path, first=METADATA_FILE)
        m = _CHECKPOINT_DIR.fullmatch(name)
        if m:
            self._release_shared(files.dirname(path), released, int(m.group(1)))

    # -- shared state files (incremental RocksDB checkpoints) -------------------------------------------------
    #
    # A state backend's SST files live in `<job dir>/shared/` and are referenced by every checkpoint whose
    # snapshot still contains them (runtime/checkpointing/backend_snapshots.py). A discarded checkpoint's
    # shared files are deleted when no remaining completed checkpoint references them: reference counting
    # recomputed from the retained `_metadata` files, so a coordinator restart needs no registry of its own.
    # Unsure means keep: a file is deleted only if every remaining checkpoint's metadata could be read.
    # Channel-state segments (`shared/chan-<n>-...`, runtime/checkpointing/channel_segments.py) are shared the
    # same way; a discard also sweeps those written by it or earlier that nothing completed references (an
    # aborted checkpoint's, which no acknowledgement listed).

    def sweep_shared(self, job_id: str) -> int:
        """Once a job has ended (no task writes any more): delete every shared file no completed checkpoint of
        the job references, returning how many. Discards release what a retired checkpoint referenced, but the
        new SST files or segments of a checkpoint that was aborted (a task killed while uploading) or discarded
        before a late write landed are referenced by nothing and known to no discard: this is their sweep.
        Unsure means keep: nothing is deleted if a completed checkpoint's metadata cannot be read."""
        job_dir = self.job_dir(job_id)
        referenced: set[str] = set()
        for _, path in self.list_completed(job_id):
            try:
                referenced |= shared_files(self.read_metadata(path))
            except CorruptCheckpoint:
                return 0
        stray = [f"{SHARED_DIR}/{n}" for n in files.list_children(files.join(job_dir, SHARED_DIR))]
        stray = sorted(set(stray) - referenced)
        for relative in stray:
            files.delete(files.join(job_dir, relative))
        return len(stray)

    def _shared_files_of(self, path: str) -> set[str]:
        try:
            return shared_files(self.read_metadata(path))
        except CorruptCheckpoint:
            return set()

    def _release_shared(self, job_dir: str, released: set[str], discarded: int) -> None:
        segments = [n for n in files.list_children(files.join(job_dir, SHARED_DIR))
                    if retention.segment_writer(n) is not None]
        if not released and not segments:
            return
        referenced: set[str] = set()
        present: set[int] = set()
        for name in files.list_children(job_dir):
            m = _CHECKPOINT_DIR.fullmatch(name)
            if not m:
                continue
            present.add(int(m.group(1)))
            path = files.join(job_dir, name)
            if not files.exists(files.join(path, METADATA_FILE)):
                continue  # in progress or aborted: its files are not in `released` (they were uploaded later)
            try:
                referenced |= shared_files(self.read_metadata(path))
            except CorruptCheckpoint:
                return
        swept = {f"{SHARED_DIR}/{n}" for n in retention.unneeded_segments(
            segments, (r.removeprefix(f"{SHARED_DIR}/") for r in referenced), discarded, present)}
        for relative in sorted((released - referenced) | swept):
            files.delete(files.join(job_dir, relative))


@dataclass(frozen=True)
class NamedFile:
    """One file a checkpoint's `_metadata` names, where storage keeps it: the one walk of the task states' shape
    that `verify`, `missing_files` and `shared_files` share. `name` and `entry` are as the metadata has them
    (unchecked: each user confines or checks what it uses)."""

    task: str
    kind: str  # "task" (its state, in, out file), "private" or "shared" (a state backend's), "segment"
    in_job_dir: bool  # relative to the job's directory (else to the checkpoint's)
    shared: bool  # in that directory's shared/ (later checkpoints may reference it)
    name: Any
    entry: Any  # the recorded check: a task file's checksum, a shared file's or a segment's list entry

    def parent(self, directory: str) -> str:
        """The directory `name` is relative to, for the checkpoint in `directory`."""
        root = files.dirname(directory) if self.in_job_dir else directory
        return files.join(root, SHARED_DIR) if self.shared else root


def named_files(metadata: CheckpointMetadata) -> Iterator[NamedFile]:
    """Every file the metadata names, task by task: a task's own files, its state backend's private and shared
    files (runtime/checkpointing/backend_snapshots.py; in the checkpoint's directory when the backend's store is
    "self", else in the job's), and the shared channel-state segments it references."""
    for task, state in sorted(metadata.task_states().items()):
        sums = state.get("checksums") or {}
        for kind in TASK_FILES:
            name = state.get(kind)
            if name:
                yield NamedFile(task, "task", False, False, name, sums.get(name))
        handle = state.get("backend")
        if isinstance(handle, dict):
            in_job_dir = handle.get("store", "job") != "self"
            for relative in handle.get("private_files") or ():
                yield NamedFile(task, "private", in_job_dir, False, relative, None)
            for entry in handle.get("shared_files") or ():
                yield NamedFile(task, "shared", in_job_dir, True, _entry_field(entry, 1), entry)
        for entry in state.get("segments") or ():
            yield NamedFile(task, "segment", True, True, _entry_field(entry, 0), entry)


def _verify_file(directory: str, named: NamedFile) -> None:
    """`verify` for one file: confined to its directory first, then checked as its kind records."""
    task = named.task
    what = {"task": "checkpoint file", "private": "state file", "shared": "shared state file",
            "segment": "channel state segment"}[named.kind] + f" of task {task}"
    if named.name is None or not isinstance(named.name, str | int):
        raise CorruptCheckpoint(f"{directory}: the {what} is malformed")
    path = files.confined_join(named.parent(directory), str(named.name), what=what, error=CorruptCheckpoint)
    entry = named.entry
    if named.kind == "private":
        if not files.exists(path):
            raise CorruptCheckpoint(f"{path}: {what} is missing")
    elif named.kind == "shared":  # immutable and named uniquely: the size is the check that matters
        size = files.size(path)
        if size != int(entry[2]):
            found = "missing" if size is None else f"{size} bytes, not {entry[2]}"
            raise CorruptCheckpoint(f"{path}: {what} is {found}")
        if len(entry) > 3:  # its CRC-32, like every other checkpoint file's (older checkpoints have none)
            read_checked(path, {"crc32": entry[3], "size": int(entry[2])}, what=what, error=CorruptCheckpoint)
    elif named.kind == "segment":
        try:
            expected = {"size": int(entry[1]), "crc32": int(entry[2])}
        except (TypeError, ValueError, IndexError, KeyError):
            raise CorruptCheckpoint(f"{directory}: the segments of task {task} are malformed") from None
        read_checked(path, expected, what=what, error=CorruptCheckpoint)
    else:
        read_checked(path, entry, what=what, error=CorruptCheckpoint)


def _entry_field(entry: Any, index: int) -> Any:
    return entry[index] if isinstance(entry, list | tuple) and len(entry) > index else None


def shared_files(metadata: CheckpointMetadata) -> set[str]:
    """The shared files (paths relative to the job's checkpoint directory) a checkpoint references: a state
    backend's and channel-state segments. A name that is not a plain file name (`..`, `/`) is a
    CorruptCheckpoint: the callers keep every file then, so a forged `_metadata` deletes nothing outside."""
    out: set[str] = set()
    for named in named_files(metadata):
        if not (named.shared and named.in_job_dir):
            continue
        name = named.name
        if not isinstance(name, str) or "/" in name:
            raise CorruptCheckpoint(f"refusing shared file {str(name)[:200]!r}: not a plain file name")
        files.confined_join(SHARED_DIR, name, what="shared file", error=CorruptCheckpoint)
        out.add(f"{SHARED_DIR}/{name}")
    return out


def _safe_name(job_id: str) -> str:
    if not job_id or job_id in (".", "..") or "/" in job_id or os.sep in job_id or "\0" in job_id:
        raise ValueError(f"job id {job_id!r} cannot name a directory")
    return job_id


def _check_number(n: int) -> int:
    if type(n) is not int or n < 0:
        raise ValueError(f"checkpoint number must be a non-negative integer, got {n!r}")
    return n
