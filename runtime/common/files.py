"""Writing a file so that after a crash it is either absent, the old version, or complete."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write `data` to `path` atomically and durably; the directory must exist.

    A temporary file in the same directory (a rename across file systems is
    not atomic), fsync, rename over `path`, then fsync of the directory so the
    rename itself survives a power cut. On any failure the temporary file is
    removed and `path` is untouched. `durable=False` leaves out both fsyncs:
    readers still see the old or the new content, but a power cut may keep the
    old (for records only a running process needs, where an fsync behind other
    writers' data can take seconds).
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_directory(directory)


def fsync_directory(directory: str) -> None:
    """Make renames and creations in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
