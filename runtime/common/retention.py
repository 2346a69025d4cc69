"""Which checkpoints the coordinator retains, as a record in the job's checkpoint directory.

The coordinator owns retention (as Flink's CompletedCheckpointStore does): after every completed checkpoint it
writes `<job checkpoint dir>/_retained`, the ids of the completed checkpoints it keeps, before it deletes the
ones it retires. Whatever else keeps data for a checkpoint outside that directory reads this record instead of
guessing from files: the remote state backend's garbage collection (runtime/state/remote.py) keeps the
versions of exactly the retained checkpoints, of checkpoints newer than every retained one (they may still be
completing), and of savepoints while their manifests exist (a savepoint belongs to the user, not to retention).
The record goes through the checkpoint-storage layer, so it works on a shared filesystem and an object store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

from runtime.common import objectstore

RETAINED_FILE = "_retained"
# a channel-state segment in the job's shared directory, named by the checkpoint that wrote it
# (runtime/checkpointing/channel_segments.py)
_SEGMENT = re.compile(r"chan-(\d+)-.+\.seg")
FORMAT = 1
_CHECKPOINT_DIR = re.compile(r"chk-(\d+)")


def encode(retained: Iterable[int]) -> bytes:
    return json.dumps({"format": FORMAT, "retained": sorted(int(n) for n in retained)}).encode()


def decode(data: bytes) -> frozenset[int] | None:
    """The retained ids, or None when the record is not one this version reads (unsure: keep everything)."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None
        return frozenset(int(n) for n in doc["retained"])
    except (ValueError, KeyError, TypeError):
        return None


def write(job_dir: str, retained: Iterable[int]) -> None:
    """Replace the job's record (blocking; the coordinator runs it in a thread)."""
    objectstore.write(objectstore.join(job_dir, RETAINED_FILE), encode(retained))


def read(job_dir: str) -> frozenset[int] | None:
    """The job's retained checkpoint ids; None if there is no (readable) record yet."""
    try:
        return decode(objectstore.read(objectstore.join(job_dir, RETAINED_FILE)))
    except FileNotFoundError:
        return None


def checkpoint_of(path: str) -> tuple[str, int] | None:
    """(job checkpoint dir, checkpoint id) of a file inside `<job dir>/chk-<n>/`; None for anything else (a
    savepoint's file)."""
    directory = objectstore.dirname(path)
    m = _CHECKPOINT_DIR.fullmatch(objectstore.basename(directory))
    return (objectstore.dirname(directory), int(m.group(1))) if m else None


def keeps(retained: frozenset[int] | None, checkpoint_id: int) -> bool:
    """Whether a checkpoint's data must stay, given the coordinator's record (None: no record, keep)."""
    return retained is None or checkpoint_id in retained or checkpoint_id > max(retained, default=-1)


class RetentionView:
    """Answers "is this checkpoint file still retained?" for one garbage collection: each job's record is read
    once, savepoint files are kept while they exist."""

    def __init__(self, *, read_record: Callable[[str], frozenset[int] | None] = read,
                 exists: Callable[[str], bool] = objectstore.exists) -> None:
        self._read = read_record
        self._exists = exists
        self._records: dict[str, frozenset[int] | None] = {}

    def retained(self, path: str) -> bool:
        found = checkpoint_of(path)
        if found is None:
            return self._exists(path)
        job_dir, checkpoint_id = found
        if job_dir not in self._records:
            self._records[job_dir] = self._read(job_dir)
        return keeps(self._records[job_dir], checkpoint_id)


def segment_writer(name: str) -> int | None:
    """The id of the checkpoint that wrote channel-state segment `name` (a file name in `shared/`), or None when
    `name` is not a segment (a state backend's file)."""
    m = _SEGMENT.fullmatch(name)
    return int(m.group(1)) if m else None


def unneeded_segments(names: Iterable[str], referenced: Iterable[str], discarded: int,
                      present: Iterable[int]) -> set[str]:
    """The channel-state segments among `names` to delete once checkpoint `discarded` is gone: those written by it
    or an earlier checkpoint whose directory is gone too (`present`: the ids of the checkpoint directories that
    remain, completed or in progress) and that no remaining completed checkpoint references (`referenced`). A
    segment of a checkpoint still in progress stays; its own discard (or a later one) sweeps it if it never
    completes."""
    keep, live = set(referenced), set(present)
    return {n for n in names
            if n not in keep and (w := segment_writer(n)) is not None and w <= discarded and w not in live}
