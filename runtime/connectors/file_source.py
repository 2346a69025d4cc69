"""FileSource: the files of a directory or an s3:// prefix, JSON lines, CSV or Parquet, read exactly once, and in
continuous mode the files that appear later too.

A file belongs to subtask crc32(its path under the root) mod p, so every subtask lists the root on its own
(every `monitor_interval` seconds) and keeps its own files; no coordination is needed. A subtask reads its
files one at a time, in name order of discovery. Its position is what it has read: the files it finished
(`done`), the file it is in and the records of it already read (`current`), and in bounded mode the files it
is still to read (`todo`: fixed by the first listing, so a restored bounded job reads what was there when it
started, not what appeared since). The bookkeeping is `FileDiscovery` (pure, no I/O).

The task restores a position and then skips the records of the batch after it that were already emitted,
so the batch after a position must always come from the same file: `current` names that file before the
batch is read. When a subtask has no current file it first only picks one (an empty batch), so the pick is
in the position before any of its records goes out.

Restored at another parallelism, each old subtask's position is moved whole (`subtask_splits`,
runtime/connectors/splits.py): it keeps reading its files (crc32 mod its old p), including new ones, so every
file is read exactly once; subtasks beyond the old parallelism get no files. Files must not change once
visible: write them under a name starting with "." or "_" (hidden) and rename, or upload them whole (S3).
"""

from __future__ import annotations

import csv
import io
import time
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from runtime.common import objectstore
from runtime.connectors.files import json_records
from runtime.connectors.source import Source

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

FORMATS = {"json": (".json", ".jsonl", ".ndjson"), "csv": (".csv",), "parquet": (".parquet",)}


def owner_of(name: str, parallelism: int) -> int:
    """The subtask of `parallelism` that reads the file `name` (its path under the root): stable everywhere."""
    return zlib.crc32(name.encode()) % parallelism


def visible(name: str, suffixes: tuple[str, ...]) -> bool:
    """A data file: the format's suffix, and no part of its path hidden ("." or "_": in progress, metadata)."""
    return name.endswith(suffixes) and not any(part.startswith((".", "_")) for part in name.split("/"))


class FileDiscovery:
    """Which of its files one subtask has read, is reading and has still to read. Pure: listings come in
    through `offer`, the task's position goes out through `position`."""

    def __init__(self, subtask_index: int, parallelism: int, *, bounded: bool) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.bounded = bounded
        self.done: set[str] = set()
        self.current: list[Any] | None = None  # [name, records of it read]
        self.todo: list[str] = []  # discovered, not started, in name order
        self.listed = False  # bounded: the one listing happened

    def offer(self, names: Iterable[str]) -> list[str]:
        """A listing of the root: this subtask's new files join `todo` (bounded: only the first listing
        counts). Returns the new ones."""
        if self.bounded and self.listed:
            return []
        self.listed = True
        known = self.done | set(self.todo) | ({self.current[0]} if self.current else set())
        new = sorted(n for n in set(names) - known if owner_of(n, self.parallelism) == self.subtask_index)
        self.todo = sorted([*self.todo, *new])
        return new

    def start_next(self) -> str | None:
        """Make the first file to do current (at offset 0); None when there is none."""
        if self.current is None and self.todo:
            self.current = [self.todo.pop(0), 0]
        return self.current[0] if self.current else None

    def advance(self, read: int) -> None:
        assert self.current is not None
        self.current[1] += read

    def finish_current(self) -> None:
        """The current file is read to its end: done; the next one (if known) becomes current at once, so the
        position names it before any of its records is read."""
        assert self.current is not None
        self.done.add(self.current[0])
        self.current = None
        self.start_next()

    @property
    def ended(self) -> bool:
        """Bounded: listed, and nothing left to read."""
        return self.bounded and self.listed and self.current is None and not self.todo

    def position(self) -> dict[str, Any]:
        return {"done": sorted(self.done), "current": list(self.current) if self.current else None,
                "todo": list(self.todo) if self.bounded else None, "listed": self.listed}

    def restore(self, position: dict[str, Any]) -> None:
        self.done = set(position["done"])
        self.current = list(position["current"]) if position.get("current") else None
        self.listed = bool(position.get("listed"))
        self.todo = list(position["todo"]) if self.bounded and position.get("todo") is not None else []


class FileSource(Source):
    """Files under `path` (a directory or an s3:// prefix) in `format` "json" (one JSON value per line; arrays
    become tuples), "csv" (a header line, then rows as dicts of strings) or "parquet" (rows as tuples, columns
    in file order; `columns` picks some). `bounded=True` reads the files there at the start and ends;
    otherwise the root is listed again every `monitor_interval` seconds and new files are read as they come.
    """

    subtask_splits = True

    def __init__(self, path: str, *, format: str = "json", monitor_interval: float = 1.0, bounded: bool = False,
                 columns: list[str] | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
        if monitor_interval <= 0:
            raise ValueError(f"monitor_interval must be > 0 seconds, not {monitor_interval!r}")
        self.path = path[len("file://"):] if path.startswith("file://") else path.rstrip("/")
        self.format = format
        self.monitor_interval = monitor_interval
        self.bounded = bounded
        self.columns = columns
        self.extras = ("parquet",) if format == "parquet" else ()
        if objectstore.is_url(self.path):
            self.extras += ("s3",)

    def check_at_submit(self, context: SubmitContext) -> None:
        """The coordinator's submit check (runtime/graph/admission.py)."""
        self.check_config()

    def check_config(self) -> None:
        """At submit: the root can be listed (a bounded source also needs it to exist)."""
        if objectstore.is_url(self.path):
            try:
                objectstore.check_reachable(self.path)
            except (OSError, objectstore.ObjectStoreUnavailable) as exc:
                raise ValueError(f"FileSource {self.path}: {exc}") from None
        elif self.bounded and not objectstore.list_tree(self.path):
            raise ValueError(f"FileSource {self.path}: no input there (a bounded source reads what is there)")

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.discovery = FileDiscovery(subtask_index, parallelism, bounded=self.bounded)
        self._next_listing = 0.0
        self._items: list[Any] = []
        self._items_of: str | None = None
        self.files_read = 0

    def restore(self, position: Any) -> None:
        self.discovery.restore(position)
        self._items_of = None

    def position(self) -> Any:
        return self.discovery.position()

    def files_pending(self) -> int:
        d = self.discovery
        return len(d.todo) + (1 if d.current else 0)

    def _list(self) -> None:
        suffixes = FORMATS[self.format]
        self.discovery.offer(n for n in objectstore.list_tree(self.path) if visible(n, suffixes))
        self._next_listing = time.monotonic() + self.monitor_interval

    def read_batch(self, max_records: int) -> list[Any] | None:
        d = self.discovery
        if d.current is None:
            if not d.todo and (not d.listed or (not self.bounded and time.monotonic() >= self._next_listing)):
                self._list()
            if d.ended:
                return None
            d.start_next()
            return []  # the pick goes into the position before any of the file's records is read
        name, offset = d.current
        if self._items_of != name:
            self._items = self._load(name)
            self._items_of = name
        chunk = self._items[offset : offset + max_records]
        d.advance(len(chunk))
        if offset + len(chunk) >= len(self._items):
            d.finish_current()
            self.files_read += 1
            self._items, self._items_of = [], None
        return self._records(chunk)

    def idle_wait_s(self) -> float:
        if self.discovery.current is not None or self.discovery.todo:
            return 0.0
        return max(0.0, min(self.monitor_interval, self._next_listing - time.monotonic()))

    # -- the formats ---------------------------------------------------------------------------------------

    def _load(self, name: str) -> list[Any]:
        data = objectstore.read(objectstore.join(self.path, name))
        if self.format == "json":
            return data.decode("utf-8").splitlines()
        if self.format == "csv":
            rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
            header = rows[0] if rows else []
            return [dict(zip(header, row, strict=False)) for row in rows[1:]]
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(pa.BufferReader(data), columns=self.columns)
        return list(zip(*(col.to_pylist() for col in table.columns), strict=True))

    def _records(self, items: list[Any]) -> list[Any]:
        return json_records(items) if self.format == "json" else items
