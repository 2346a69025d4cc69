"""Checksums of checkpoint files: CRC-32 (zlib) and size, so a restore can tell a flipped bit from good data.

A checksum is a small JSON-friendly dict, recorded in a checkpoint's `_metadata`
by the coordinator and checked again before anything is restored. `read_checked` is the one verified read
every reader of checkpoint files goes through (the coordinator's verification, a task's restore, the state
processor): a file that is missing or differs from its recorded checksum is a `CorruptFile` whose message is
one line naming the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.common import objectstore


class CorruptFile(ValueError):
    """A checkpoint file is missing, unreadable, truncated or not what its checksum or format says."""


def checksum(data: bytes) -> dict[str, int]:
    return {"crc32": zlib.crc32(data), "size": len(data)}


def mismatch(data: bytes, expected: Any) -> str | None:
    """Why `data` does not match the recorded checksum `expected`, or None if it does."""
    if not isinstance(expected, dict) or type(expected.get("crc32")) is not int \
            or type(expected.get("size")) is not int:
        return f"no usable checksum recorded ({expected!r})"
    if len(data) != expected["size"]:
        return f"size {len(data)} bytes, expected {expected['size']}"
    crc = zlib.crc32(data)
    if crc != expected["crc32"]:
        return f"CRC-32 {crc:08x}, expected {expected['crc32']:08x}"
    return None


def read_checked(path: str, expected: Any, *, what: str = "checkpoint file",
                 error: type[CorruptFile] = CorruptFile) -> bytes:
    """The bytes of checkpoint file `path` (local or `s3://`), checked against the checksum recorded for it.

    `path` must already be confined to the checkpoint's directories (objectstore.confined_join): the message
    describes the file read, which is then one of the checkpoint's own. `error`: the caller's subclass of
    CorruptFile to raise."""
    try:
        data = objectstore.read(path)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    problem = mismatch(data, expected)
    if problem is not None:
        raise error(f"{path}: {what} is corrupt: {problem}")
    return data


def read_segments(shared_dir: str, sums: Mapping[str, Any], names: Iterable[str], *,
                  owner: str, error: type[CorruptFile] = CorruptFile) -> dict[str, bytes]:
    """The shared channel-state segments `names` (file names in `shared_dir`), each read and checked against
    `sums[name]`; a segment missing, corrupt or named outside `shared_dir` is a CorruptFile naming it."""
    out: dict[str, bytes] = {}
    for name in sorted(set(names)):
        what = f"channel state segment of {owner}"
        path = objectstore.confined_join(shared_dir, name, what=what, error=error)
        out[name] = read_checked(path, sums.get(name), what=what, error=error)
    return out


def file_crc32(path: str, chunk: int = 1 << 20) -> int:
    """The CRC-32 of a local file, read in chunks (an SST file may be large)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc
