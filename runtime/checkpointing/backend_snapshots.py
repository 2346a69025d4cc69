"""A state backend's snapshot inside a task's checkpoint: where its files go, and how it comes back.

The synchronous part (`begin_snapshot`: a RocksDB checkpoint of hard links) runs at the barrier; the
upload runs in the worker's checkpoint writer thread just before the task's operator state file is
encoded, and that file records the resulting handle under "backend". The handle also goes into the task's
acknowledgement (and so into `_metadata`), where the coordinator reads the shared files each retained
checkpoint references before it deletes one (coordinator/storage.py, shared-file retention).

Where the files go (a SnapshotStore root):
- a checkpoint: the job's checkpoint directory `<state-dir>/checkpoints/<job-id>/` (a local path or an
  `s3://` URL alike), private files in `chk-<n>/` next to the task files, SST files in `shared/`, which
  later checkpoints reference again (incremental: only new SST files are uploaded);
- a savepoint: the savepoint directory itself, so a savepoint is self-contained (its first upload into
  that store copies every file).
The layout is stored in the handle ("store": "job" or "self") rather than a path, so a checkpoint directory
moved elsewhere still restores.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from runtime.common import objectstore
from runtime.state.backend import PendingSnapshot, SnapshotHandle, StateBackend, StateBackendError
from runtime.state.files import SnapshotStore

JOB_STORE = "job"  # the root is the parent of the checkpoint directory
SELF_STORE = "self"  # the root is the checkpoint (savepoint) directory itself


def store_root(directory: str, *, savepoint: bool) -> tuple[str, str]:
    """(root, layout) of the SnapshotStore for a checkpoint written to `directory`."""
    if savepoint:
        return directory, SELF_STORE
    return _parent(directory), JOB_STORE


def upload(pending: PendingSnapshot, directory: str, *, savepoint: bool, full: bool = False) -> dict[str, Any]:
    """The asynchronous part (any thread): upload and return the handle as stored in the checkpoint; `full`
    references no file an earlier checkpoint uploaded."""
    root, layout = store_root(directory, savepoint=savepoint)
    try:
        store = SnapshotStore(root)
    except BaseException:
        pending.abort()
        raise
    handle = pending.upload(store, share=not full)
    return {**handle.to_dict(), "store": layout}


def restore(backend: StateBackend, handles: Sequence[dict[str, Any]], checkpoint_path: str) -> None:
    """Fill `backend` from the handles of a checkpoint at `checkpoint_path` (blocking: run it in a thread).

    Every handle of one restore comes from the same checkpoint, so they share one store."""
    if not handles:
        return
    layouts = {h.get("store", JOB_STORE) for h in handles}
    if len(layouts) != 1:
        raise StateBackendError(f"{checkpoint_path}: state snapshot handles name different stores {layouts}")
    directory = checkpoint_path
    if objectstore.basename(directory) == "_metadata":
        directory = objectstore.dirname(directory)
    root = directory if layouts == {SELF_STORE} else _parent(directory)
    backend.restore(SnapshotStore(root), [SnapshotHandle.from_dict(h) for h in handles])


def _parent(directory: str) -> str:
    return objectstore.dirname(directory) if objectstore.is_url(directory) else os.path.dirname(
        os.path.normpath(directory))
