"""Where state snapshots are stored, and when their shared files may be deleted.

Layout under the store's root (the job's checkpoint directory, or a savepoint directory), a local path or an
`s3://` URL alike: every read and write goes through the checkpoint-storage layer
(runtime/common/objectstore.py):

- `chk-<id>/<owner>-<file>`: files private to one checkpoint (a RocksDB
  MANIFEST and CURRENT, a memory backend's encoded tables, a remote-state manifest);
- `shared/<file>`: files that later checkpoints may reference again (SST
  files, which RocksDB never changes once written). An incremental checkpoint
  uploads only the SST files the previous one did not have.

Each upload is whole or absent after a crash (local: copy, fsync, rename; object store: one PUT).
`SharedFileRegistry` counts references from retained checkpoints (as Flink's SharedStateRegistry does on the
JobManager); it is pure bookkeeping, rebuilt from the retained handles after a restart.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runtime.common import objectstore

if TYPE_CHECKING:
    from runtime.state.backend import SnapshotHandle

SHARED_DIR = "shared"


class SnapshotStore:
    def __init__(self, root: str) -> None:
        self.root = objectstore.absolute(root)
        objectstore.make_dir(objectstore.join(self.root, SHARED_DIR))

    def private_dir(self, checkpoint_id: int) -> str:
        path = objectstore.join(self.root, f"chk-{checkpoint_id}")
        objectstore.make_dir(path)
        return path

    def path(self, relative: str) -> str:
        """`relative` under the root; a name from a snapshot handle that could point elsewhere (absolute, `..`)
        is refused before anything is touched (objectstore.OutsideDirectory)."""
        return objectstore.confined_join(self.root, relative, what="state snapshot file")

    def shared_path(self, name: str) -> str:
        return objectstore.confined_join(objectstore.join(self.root, SHARED_DIR), name, what="shared state file")

    def upload(self, source: str, relative: str) -> int:
        """Copy the local file `source` to `relative` under the root durably; returns the bytes copied."""
        return objectstore.upload_file(source, self.path(relative))

    def download(self, relative: str, target: str) -> None:
        objectstore.download_file(self.path(relative), target)

    def read(self, relative: str) -> bytes:
        return objectstore.read(self.path(relative))

    def write(self, relative: str, data: bytes) -> None:
        """Create or replace `relative` with `data`, whole or not at all."""
        objectstore.write(self.path(relative), data)

    def size(self, relative: str) -> int | None:
        return objectstore.size(self.path(relative))

    def delete(self, relatives: Iterable[str]) -> None:
        for relative in relatives:
            objectstore.delete(self.path(relative))

    def discard(self, handle: SnapshotHandle, registry: SharedFileRegistry) -> list[str]:
        """Delete a handle's private files and the shared files no other retained handle references.

        Returns the shared files deleted (relative paths).
        """
        self.delete(handle.private_files)
        unreferenced = registry.release(handle)
        self.delete(unreferenced)
        if not objectstore.is_url(self.root):
            for directory in {objectstore.dirname(p) for p in handle.private_files}:
                with contextlib.suppress(OSError):  # not empty: other tasks' files of the same checkpoint
                    os.rmdir(self.path(directory))
        return unreferenced


class SharedFileRegistry:
    """Reference counts of shared files over the retained snapshot handles."""

    def __init__(self) -> None:
        self._refs: Counter[str] = Counter()

    def register(self, handle: SnapshotHandle) -> None:
        for f in handle.shared_files:
            self._refs[shared_relative(f.name)] += 1

    def release(self, handle: SnapshotHandle) -> list[str]:
        """Drop one handle's references; returns the files now referenced by nobody."""
        freed = []
        for f in handle.shared_files:
            relative = shared_relative(f.name)
            if self._refs[relative] <= 0:
                raise ValueError(f"checkpoint {handle.checkpoint_id} releases {relative}, which no handle holds")
            self._refs[relative] -= 1
            if self._refs[relative] == 0:
                del self._refs[relative]
                freed.append(relative)
        return freed

    def count(self, name: str) -> int:
        return self._refs.get(shared_relative(name), 0)

    def referenced(self) -> set[str]:
        return set(self._refs)


def shared_relative(name: str) -> str:
    return f"{SHARED_DIR}/{name}"
