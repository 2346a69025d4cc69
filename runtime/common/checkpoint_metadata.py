"""A checkpoint's `_metadata` file as bytes on storage: its name, format, checksum and how it is written.

The coordinator writes it for every checkpoint (coordinator/storage.py); the state processor writes it for the
savepoints it makes (runtime/data/checkpoint_state.py). One definition, so both write what both read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runtime.common import objectstore
from runtime.common.checksums import checksum

METADATA_FILE = "_metadata"
FORMAT_VERSION = 2


def metadata_body(doc: Mapping[str, Any]) -> bytes:
    """What the metadata's own checksum covers: the document without its `checksum` field, serialised the one
    way `encode_metadata` does (sorted keys), so a reader recomputes exactly the bytes that were summed."""
    return json.dumps({k: v for k, v in doc.items() if k != "checksum"}, indent=1, sort_keys=True).encode()


def encode_metadata(doc: Mapping[str, Any]) -> bytes:
    """The file's bytes: `doc` with its checksum."""
    return json.dumps({**doc, "checksum": checksum(metadata_body(doc))}, indent=1, sort_keys=True).encode()


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
