"""A checkpoint's `_metadata` file as bytes on storage: its name, format, checksum, how it is written and read.

The coordinator writes it for every checkpoint (coordinator/storage.py); the state processor writes it for the
savepoints it makes (runtime/data/checkpoint_state.py). One definition, so both write what both read; every
reader goes through `read_metadata_document` and then runtime/graph/checkpoint_metadata.py's CheckpointMetadata.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runtime.common import objectstore
from runtime.common.checksums import CorruptFile, checksum, mismatch

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


class BadMetadata(CorruptFile):
    """A `_metadata` that is missing, unreadable or unusable; the message starts with the path."""


def metadata_file(path: str) -> str:
    """The `_metadata` file of a checkpoint, given its directory or the file itself (local or `s3://`)."""
    directory = objectstore.absolute(path)
    if objectstore.basename(directory) == METADATA_FILE:
        return directory
    return objectstore.join(directory, METADATA_FILE)


def shape_problem(doc: Any) -> str | None:
    """What is wrong with a `_metadata` document's envelope (its format version), or None; the fields inside are
    CheckpointMetadata's to check."""
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    if "format" not in doc:
        return "no 'format' version field"
    version = doc["format"]
    if type(version) is not int or version != FORMAT_VERSION:
        return f"unsupported metadata format {version!r} (this version reads format {FORMAT_VERSION})"
    return None


def read_metadata_document(path: str) -> dict[str, Any]:
    """The document of the `_metadata` at `path` (a checkpoint directory or the file), its format and checksum
    checked, without the envelope's `format` and `checksum`; BadMetadata naming the file otherwise."""
    file = metadata_file(path)
    try:
        data = objectstore.read(file)
    except FileNotFoundError:
        if objectstore.basename(objectstore.absolute(path)) == METADATA_FILE:
            raise BadMetadata(f"{file}: checkpoint metadata is missing") from None
        raise BadMetadata(f"{objectstore.dirname(file)}: not a completed checkpoint or savepoint "
                          f"(no {METADATA_FILE})") from None
    except OSError as exc:
        raise BadMetadata(f"{file}: cannot read checkpoint metadata: {exc.strerror or exc}") from None
    if not data.strip():
        raise BadMetadata(f"{file}: checkpoint metadata is empty")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadMetadata(f"{file}: checkpoint metadata is truncated or not JSON ({exc})") from None
    problem = shape_problem(doc)
    if problem is not None:
        raise BadMetadata(f"{file}: {problem}")
    problem = body_mismatch(doc, doc.pop("checksum", None))
    if problem is not None:
        raise BadMetadata(f"{file}: checkpoint metadata is corrupt: {problem}")
    doc.pop("format")
    return doc
