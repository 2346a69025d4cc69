"""Where state snapshots are stored, and when their shared files may be deleted.

Layout under the store's root (the job's checkpoint directory, or any
directory standing in for remote storage):

- `chk-<id>/<owner>-<file>`: files private to one checkpoint (a RocksDB
  MANIFEST and CURRENT, a memory backend's encoded tables);
- `shared/<file>`: files that later checkpoints may reference again (SST
  files, which RocksDB never changes once written). An incremental checkpoint
  copies only the SST files the previous one did not have.

Copying into the store stands for uploading to remote storage: each file is
copied, fsynced, and renamed into place, so a crash leaves a file whole or
absent. `SharedFileRegistry` counts references from retained checkpoints (as
Flink's SharedStateRegistry does on the JobManager); it is pure bookkeeping,
rebuilt from the retained handles after a restart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runtime.common.files import fsync_directory

if TYPE_CHECKING:
    from runtime.state.backend import SnapshotHandle

SHARED_DIR = "shared"


class SnapshotStore:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(os.path.join(self.root, SHARED_DIR), exist_ok=True)

    def private_dir(self, checkpoint_id: int) -> str:
        path = os.path.join(self.root, f"chk-{checkpoint_id}")
        os.makedirs(path, exist_ok=True)
        return path

    def path(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    def shared_path(self, name: str) -> str:
        return os.path.join(self.root, SHARED_DIR, name)

    def upload(self, source: str, relative: str) -> int:
        """Copy `source` to `relative` under the root durably; returns the bytes copied."""
        target = self.path(relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = target + ".uploading"
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
            size = dst.tell()
        os.replace(tmp, target)
        fsync_directory(os.path.dirname(target))
        return size

    def download(self, relative: str, target: str) -> None:
        shutil.copyfile(self.path(relative), target)

    def delete(self, relatives: Iterable[str]) -> None:
        for relative in relatives:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(relative))

    def discard(self, handle: SnapshotHandle, registry: SharedFileRegistry) -> list[str]:
        """Delete a handle's private files and the shared files no other retained handle references.

        Returns the shared files deleted (relative paths).
        """
        self.delete(handle.private_files)
        unreferenced = registry.release(handle)
        self.delete(unreferenced)
        private = {os.path.dirname(p) for p in handle.private_files}
        for directory in private:
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
