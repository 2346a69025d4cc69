"""File sources (JSON lines, Parquet) and the file sink.

Sources split their input across subtasks in fixed units (a file for JSON
lines, a row group for Parquet), unit u going to subtask u mod p, and keep a
position (unit, row) that a checkpoint can store; restored at another
parallelism they read the lanes handed to them (source.py).

The sink writes part files. A file being written is hidden (its name starts
with a dot), so readers such as Spark never see half a file; it becomes
visible by an atomic rename when it is committed.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import glob
import json
import json.scanner
import os
import uuid
from typing import Any

from runtime.common import extras
from runtime.connectors.sinks import ForgedSinkState, OutputGone, Sink
from runtime.connectors.source import LaneReader, Source, position_lanes


class MissingDependency(RuntimeError):
    pass


def _pyarrow_parquet() -> Any:
    """pyarrow is the `parquet` extra (most of a full install's size): imported only when Parquet is used."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependency(extras.describe_missing(["parquet"])) from exc
    return pq


# the C scanner under json.loads: one call per line instead of loads' three Python frames (half a line's cost)
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: a decoder


def json_records(lines: list[str]) -> list[Any]:
    """The records of JSON-lines text lines: blank lines skipped, JSON arrays as tuples. A line that is one value
    and nothing else goes through the C scanner; any other (whitespace around the value, a blank line, a
    malformed one) through `json.loads`, which skips it, parses it or raises its error, exactly as before."""
    out: list[Any] = []
    add = out.append
    for text in lines:
        try:
            value, end = _scan_json(text, 0)
            if end != len(text):
                raise ValueError
        except (StopIteration, ValueError):
            if not text.strip():
                continue
            value = json.loads(text)
        add(tuple(value) if type(value) is list else value)
    return out


def list_input_files(path: str, suffixes: tuple[str, ...]) -> list[str]:
    """Visible files under `path` (a file, a directory, or a glob), sorted for a stable split."""
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            found += [os.path.join(root, f) for f in files if not f.startswith((".", "_")) and f.endswith(suffixes)]
    elif any(ch in path for ch in "*?["):
        found = [p for p in glob.glob(path) if not os.path.basename(p).startswith((".", "_"))]
    elif os.path.exists(path):
        found = [path]
    else:
        raise FileNotFoundError(f"no input at {path}")
    return sorted(found)


class _UnitSource(Source):
    """Reads units (files, row groups) by lanes (source.py): unit u of the sorted list belongs to subtask
    u mod p unless a rescaled restore handed out other lanes. Positions are [unit, item] in the subtask's
    own sequence, or {"lanes": ...} after a rescale."""

    rescalable = True

    def _list_units(self) -> list[Any]:
        raise NotImplementedError

    def _load(self, unit: Any) -> list[Any]:
        raise NotImplementedError

    def _is_record(self, item: Any) -> bool:
        return True

    def _records(self, items: list[Any]) -> list[Any]:
        return list(items)

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._units = self._list_units()
        self._lanes = LaneReader([[subtask_index, 0, 0, parallelism]])
        self._items: list[Any] = []
        self._items_unit: int | None = None

    def read_batch(self, max_records: int) -> list[Any] | None:
        while True:
            lane = self._lanes.current()
            if lane is None:
                return None
            if lane[0] >= len(self._units):
                self._lanes.drop(lane)
                continue
            if self._items_unit != lane[0]:
                self._items = self._load(self._units[lane[0]])
                self._items_unit = lane[0]
            while lane[2] > 0 and lane[1] < len(self._items):  # records already emitted before a rescale
                lane[2] -= self._is_record(self._items[lane[1]])
                lane[1] += 1
            lane[2] = 0
            chunk = self._items[lane[1] : lane[1] + max_records]
            lane[1] += len(chunk)
            if lane[1] >= len(self._items):
                self._lanes.advance(lane)
            out = self._records(chunk)
            if out:
                return out

    def position(self) -> Any:
        lanes = self._lanes.lanes
        if (len(lanes) == 1 and lanes[0][3] == self.parallelism and lanes[0][2] == 0
                and (lanes[0][0] - self.subtask_index) % self.parallelism == 0):  # the subtask's own units
            return [(lanes[0][0] - self.subtask_index) // self.parallelism, lanes[0][1]]
        return self._lanes.snapshot()

    def lanes(self, position: Any, emitted: int, subtask_index: int, parallelism: int) -> list[list[int]]:
        if isinstance(position, list):  # [index in the subtask's own units, item] -> global unit
            position = [subtask_index + int(position[0]) * parallelism, position[1]]
        return position_lanes(position, emitted, subtask_index, parallelism)

    def restore(self, position: Any) -> None:
        if isinstance(position, dict):
            lanes = position_lanes(position, 0, self.subtask_index, self.parallelism)
        else:  # [index in this subtask's own units, item]
            lanes = [[self.subtask_index + int(position[0]) * self.parallelism, int(position[1]), 0,
                      self.parallelism]]
        self._lanes = LaneReader(lanes)
        self._items_unit = None


class JsonLinesSource(_UnitSource):
    """One JSON value per line; JSON arrays become tuples. Files are split across subtasks."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _list_units(self) -> list[Any]:
        return list_input_files(self.path, (".json", ".jsonl", ".ndjson"))

    def _load(self, unit: Any) -> list[Any]:
        with open(unit, encoding="utf-8") as f:
            return f.read().splitlines()

    def _is_record(self, item: Any) -> bool:
        return bool(item.strip())

    def _records(self, items: list[Any]) -> list[Any]:
        return json_records(items)


class ParquetSource(_UnitSource):
    """Rows of Parquet files as tuples (columns in file order); row groups are split across subtasks."""

    extras = ("parquet",)

    def __init__(self, path: str, columns: list[str] | None = None) -> None:
        self.path = path
        self.columns = columns

    def _list_units(self) -> list[Any]:
        pq = _pyarrow_parquet()
        units = []
        for file in list_input_files(self.path, (".parquet",)):
            groups = pq.ParquetFile(file).metadata.num_row_groups
            units += [(file, g) for g in range(groups)]
        return units

    def _load(self, unit: Any) -> list[Any]:
        file, group = unit
        table = _pyarrow_parquet().ParquetFile(file).read_row_group(group, columns=self.columns)
        return list(zip(*(col.to_pylist() for col in table.columns), strict=True))


class FileSink(Sink):
    """Part files of JSON lines (or Parquet with format='parquet') under `path`, committed exactly once.

    Two-phase: records go to hidden in-progress files
    (`.part-<subtask>-<attempt>-<n>.<ext>.inprogress`). At a checkpoint's
    snapshot the current file is closed and becomes pending for that
    checkpoint, which also names it: when a checkpoint completes, every file
    pending up to it is committed by an atomic rename to
    `part-<subtask>-<checkpoint:06d>-<attempt>-<n>.<ext>`. A pending file of an
    aborted checkpoint keeps its name and waits for the next completed one
    (whose snapshot lists it as pending too). `n` counts on over every file of
    the subtask, so names stay unique across attempts and resubmissions.

    On restore from checkpoint K, commits of K are redone (a rename that
    already happened is skipped), and everything this subtask wrote after K
    is deleted: committed files named by a checkpoint after K (an older
    retained checkpoint, or the last one of a finished job, is restored
    without duplicates) and every other in-progress file, whose records will
    be produced again. At the end of a bounded input the current file is
    closed; the checkpoint the task takes after its end of input pre-commits
    and then commits it.
    """

    def __init__(self, path: str, *, format: str = "jsonl", rolling_bytes: int = 64 * 1024 * 1024,
                 if_exists: str = "fail", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if format not in ("jsonl", "parquet"):
            raise ValueError(f"format must be 'jsonl' or 'parquet', not {format!r}")
        if if_exists not in ("fail", "append"):
            raise ValueError(f"if_exists must be 'fail' or 'append', not {if_exists!r}")
        self.path = path
        self.format = format
        self.rolling_bytes = rolling_bytes
        # "fail": a new job (not a restore) refuses a directory that already holds visible files, so a second run
        # does not mix its output with the first one's; "append": it adds its files to them (checked at submit)
        self.if_exists = if_exists
        self.extras = ("parquet",) if format == "parquet" else ()

    def earlier_output(self) -> list[str]:
        """The visible files already in the directory (an earlier run's output), sorted; [] when there is none."""
        try:
            names = os.listdir(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if not n.startswith((".", "_")))

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        os.makedirs(self.path, exist_ok=True)
        self._encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=json_value).encode
        self._part = self._next_free_part()
        self._lines: list[str] = []
        self._rows: list[Any] = []
        self._bytes = 0
        self._file: Any = None
        self._written: list[list[str]] = []  # [hidden, committed name's tail], since the last snapshot
        self._pending: list[list[Any]] = []  # [checkpoint id, hidden, final], pre-committed

    def _next_free_part(self) -> int:
        """Part numbers go on after every file of this subtask already there, of any attempt: a job submitted
        with a restore runs attempt 0 again, and a commit must never replace a file committed before."""
        last = -1
        for name in os.listdir(self.path):
            parsed = _parse_part(name, self.subtask_index)
            if parsed is not None:
                last = max(last, parsed[1])
        return last + 1

    def _ext(self) -> str:
        return "jsonl" if self.format == "jsonl" else "parquet"

    def _names(self) -> tuple[str, str]:
        """The in-progress file and its committed name without the checkpoint (filled in at the snapshot)."""
        hidden = f".part-{self.subtask_index}-{self.attempt}-{self._part}.{self._ext()}.inprogress"
        return os.path.join(self.path, hidden), f"{self.attempt}-{self._part}.{self._ext()}"

    def _final(self, checkpoint_id: int, tail: str) -> str:
        return os.path.join(self.path, f"part-{self.subtask_index}-{checkpoint_id:06d}-{tail}")

    def write(self, record: Any) -> None:
        if self.format == "parquet":
            self._rows.append(record)
            return
        line = self._encode(record)
        self._lines.append(line)
        self._bytes += len(line) + 1
        if len(self._lines) >= 4096:
            self._flush_lines()

    def _flush_lines(self) -> None:
        if not self._lines:
            return
        if self._file is None:
            hidden, tail = self._names()
            self._file = open(hidden, "w", encoding="utf-8")  # noqa: SIM115 - open across writes, closed on roll
            self._written.append([hidden, tail])
        self._file.write("\n".join(self._lines) + "\n")
        self._lines = []
        if self._bytes >= self.rolling_bytes:
            self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            self._part += 1
            self._bytes = 0

    def _write_parquet(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        pq = _pyarrow_parquet()
        first = self._rows[0]
        if isinstance(first, dict):
            table = pa.Table.from_pylist(self._rows)
        else:
            width = len(first)
            table = pa.table({f"f{i}": [r[i] for r in self._rows] for i in range(width)})
        hidden, tail = self._names()
        pq.write_table(table, hidden)
        self._written.append([hidden, tail])
        self._rows = []
        self._part += 1

    def _close_current(self) -> None:
        if self.format == "parquet":
            self._write_parquet()
        else:
            self._flush_lines()
            self._close_file()

    @staticmethod
    def _publish(hidden: str, final: str) -> None:
        if os.path.exists(hidden):
            os.replace(hidden, final)
        elif not os.path.exists(final):
            raise OutputGone(f"pre-committed file {hidden} is gone and {final} was never published: the sink's "
                             "directory was cleared or changed since the checkpoint; restore it, or start afresh")

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._close_current()
        self._pending += [[checkpoint_id, hidden, self._final(checkpoint_id, tail)] for hidden, tail in self._written]
        self._written = []
        return {"pending": [list(p) for p in self._pending], "checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        keep = []
        for entry in self._pending:
            if entry[0] <= checkpoint_id:
                self._publish(entry[1], entry[2])
            else:
                keep.append(entry)
        self._pending = keep

    def restore_state(self, state: Any) -> None:
        state = state or {}
        pending = [self._confined(entry) for entry in state.get("pending", [])]  # every one, before any rename
        for _, hidden, final in pending:
            self._publish(hidden, final)  # that checkpoint completed: its commit is (re)done
        restored = state.get("checkpoint")
        # after a rescale this subtask also cleans up for the old subtasks whose pending files it took over
        owners = {self.subtask_index, *(int(s) for s in state.get("subtasks", []))}
        for name in os.listdir(self.path):
            parsed = next((p for p in (_parse_part(name, o) for o in owners) if p is not None), None)
            if parsed is None:
                continue
            checkpoint, _ = parsed
            # in-progress (never committed), or committed by a checkpoint after the restored one: either way
            # its records come after the restored checkpoint and will be produced again
            if checkpoint is None or (restored is not None and checkpoint > restored):
                os.remove(os.path.join(self.path, name))

    def _confined(self, entry: Any) -> tuple[int, str, str]:
        """A pre-committed file of the restored state, refused (ForgedSinkState) unless both of its names are part
        files of this sink's directory: a forged checkpoint must not make the worker rename files elsewhere.
        The refusal names the sink's directory only, nothing about what the entry points at."""
        try:
            checkpoint, hidden, final = entry
            names = (os.path.basename(hidden), os.path.basename(final))
            inside = all(os.path.abspath(os.path.dirname(p)) == os.path.abspath(self.path) for p in (hidden, final))
        except (TypeError, ValueError):
            inside, names = False, ("", "")
        if not (inside and type(checkpoint) is int and names[0].startswith(".part-")
                and names[0].endswith(".inprogress") and names[1].startswith("part-")):
            raise ForgedSinkState(f"FileSink {self.path}: the restored state names a pending file that is not one of "
                             "this sink's part files in its directory: refused, nothing renamed")
        return checkpoint, hidden, final

    def finish(self) -> None:
        self._close_current()

    def close(self) -> None:
        """Also after a cancel or failure: files written since the last pre-commit will never be committed."""
        if self._file is not None:
            self._file.close()
            self._file = None
        for hidden, _tail in self._written:
            try:
                os.remove(hidden)
            except FileNotFoundError:
                pass
        self._written = []


def json_value(value: Any) -> Any:
    """What a JSON-lines file holds for a value JSON has no type for (records carry any picklable value):
    dates and times in ISO 8601, a Decimal as its exact string, a set as a sorted list, a dataclass as an
    object; anything else is a TypeError naming the type, failing the task."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"FileSink(format='jsonl') cannot write a value of type {type(value).__module__}."
                    f"{type(value).__qualname__}: map it to JSON types (or a dataclass, date, Decimal, set) first")


def _parse_part(name: str, subtask: int) -> tuple[int | None, int] | None:
    """(checkpoint, n) of a part file of `subtask`: checkpoint None for an in-progress file; None for a file
    that is not one of the subtask's (another subtask's, or anything else in the directory)."""
    hidden = name.startswith(".") and name.endswith(".inprogress")
    stem = name.removeprefix(".").split(".", 1)[0]
    fields = stem.split("-")
    if fields[0] != "part" or not all(f.isdigit() for f in fields[1:]) or fields[1:2] != [str(subtask)]:
        return None
    if hidden and len(fields) == 4:  # .part-<subtask>-<attempt>-<n>.<ext>.inprogress
        return None, int(fields[3])
    if not hidden and not name.startswith(".") and len(fields) == 5:  # part-<subtask>-<checkpoint>-<attempt>-<n>
        return int(fields[2]), int(fields[4])
    return None
