"""A checkpoint's `_metadata` file as bytes on storage: its name, format, checksum and how it is written.

The coordinator writes it for every checkpoint (coordinator/storage.py); the state processor writes it for the
savepoints it makes (runtime/data/checkpoint_state.py). One definition, so both write what both read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runtime.common import objectstore
from runtime.common.checksums import checksum, mismatch

METADATA_FILE = "_metadata"
FORMAT_VERSION = 2


def metadata_body(doc: Mapping[str, Any]) -> bytes:
    """What the metadata's own checksum covers: the document without its `checksum` field, serialised the one
    way `encode_metadata` does (sorted keys, compact), so a reader recomputes exactly the bytes that were summed.
    Compact because json encodes it in C then: indented, it takes the pure-Python encoder, about 35 µs per task
    and checkpoint, the largest share of the coordinator's work in a 1,000-task checkpoint (docs/BENCHMARKS.md)."""
    return _body(doc, indent=None)


def _body(doc: Mapping[str, Any], indent: int | None) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k != "checksum"}, indent=indent, sort_keys=True).encode()


def body_mismatch(doc: Mapping[str, Any], recorded: Any) -> str | None:
    """Why `doc` (without its checksum) does not match the checksum `recorded` for it, or None if it does. Files
    written before the body was compact were indented by one space: they still verify."""
    problem = mismatch(metadata_body(doc), recorded)
    if problem is not None and mismatch(_body(doc, indent=1), recorded) is None:
        return None
    return problem


def encode_metadata(doc: Mapping[str, Any]) -> bytes:
    """The file's bytes: `doc` with its checksum."""
    return json.dumps({**doc, "checksum": checksum(metadata_body(doc))}, sort_keys=True).encode()


def write_metadata_file(directory: str, data: bytes) -> str:
    """Write `<directory>/_metadata` last and whole; returns its path. Local: temp file, fsync, rename (after a
    crash the file is absent or complete). Object store: one conditional PUT that never replaces an existing
    `_metadata` (a second write of the same checkpoint fails with FileExistsError)."""
    path = objectstore.join(directory, METADATA_FILE)
    if objectstore.is_url(path):
        objectstore.write_new(path, data)
    else:
        objectstore.write(path, data)
    return path
