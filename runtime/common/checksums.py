"""Checksums of checkpoint files: CRC-32 (zlib) and size, so a restore can tell a flipped bit from good data.

A checksum is a small JSON-friendly dict, recorded in a checkpoint's `_metadata`
by the coordinator and checked again before anything is restored.
"""

from __future__ import annotations

import zlib
from typing import Any


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


def file_crc32(path: str, chunk: int = 1 << 20) -> int:
    """The CRC-32 of a local file, read in chunks (an SST file may be large)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc
