"""The continuous file source's bookkeeping (runtime/connectors/file_source.py, FileDiscovery): which files a
subtask owns, reads next and has done, exactly as its position says; and the source reading real files
through a restore from a position, files added later included."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from runtime.connectors.file_source import FileDiscovery, FileSource, owner_of, visible

NAMES = [f"in-{i:02d}.json" for i in range(12)]


def mine(subtask: int, parallelism: int, names: list[str] = NAMES) -> list[str]:
    return sorted(n for n in names if owner_of(n, parallelism) == subtask)


def test_every_file_has_exactly_one_owner_and_hidden_files_are_skipped() -> None:
    owners = [[n for n in NAMES if n in mine(s, 3)] for s in range(3)]
    assert sorted(n for o in owners for n in o) == NAMES
    assert visible("a/b.json", (".json",)) and not visible(".b.json", (".json",))
    assert not visible("_tmp/b.json", (".json",)) and not visible("b.csv", (".json",))


def test_new_files_are_offered_once_and_read_in_name_order() -> None:
    d = FileDiscovery(0, 1, bounded=False)
    assert d.offer(["b.json", "a.json"]) == ["a.json", "b.json"]
    assert d.start_next() == "a.json"
    d.advance(5)
    assert d.offer(["a.json", "b.json", "c.json"]) == ["c.json"]  # known ones are not offered again
    d.finish_current()
    assert d.position() == {"done": ["a.json"], "current": ["b.json", 0], "todo": None, "listed": True}
    d.finish_current()
    d.finish_current()
    assert d.current is None and d.offer(["a.json", "b.json", "c.json"]) == [] and not d.ended


def test_bounded_reads_the_first_listing_only_and_keeps_it_in_its_position() -> None:
    d = FileDiscovery(0, 1, bounded=True)
    d.offer(["a.json", "b.json"])
    d.start_next()
    d.advance(3)
    position = d.position()
    assert position == {"done": [], "current": ["a.json", 3], "todo": ["b.json"], "listed": True}
    assert d.offer(["c.json"]) == []
    restored = FileDiscovery(0, 1, bounded=True)
    restored.restore(position)
    assert restored.offer(["a.json", "b.json", "c.json"]) == []  # what appeared since is not read
    restored.finish_current()
    restored.finish_current()
    assert restored.ended and restored.done == {"a.json", "b.json"}


def test_a_restored_subtask_skips_what_it_finished_and_resumes_its_file() -> None:
    d = FileDiscovery(1, 3, bounded=False)
    d.restore({"done": mine(1, 3)[:2], "current": [mine(1, 3)[2], 7], "todo": None, "listed": True})
    assert d.offer(NAMES) == mine(1, 3)[3:]
    assert d.current == [mine(1, 3)[2], 7]


def read_all(source: FileSource, *, position: Any = None, limit: int | None = None) -> tuple[list[Any], Any]:
    out: list[Any] = []
    if position is not None:
        source.restore(position)
    for _ in range(10_000):
        if limit is not None and len(out) >= limit:
            break
        batch = source.read_batch(7 if limit is None else min(7, limit - len(out)))
        if batch is None:
            break
        if not batch and source.discovery.current is None and not source.discovery.todo:
            break  # continuous: nothing more to read now
        out += batch
    return out, source.position()


def write(directory: Path, name: str, rows: list[Any]) -> None:
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_source_reads_each_file_once_across_a_restore_and_picks_up_new_files(tmp_path: Path) -> None:
    for i in range(4):
        write(tmp_path, f"in-{i}.json", [[i, n] for n in range(10)])
    (tmp_path / ".in-9.json").write_text("[9, 9]\n")  # hidden: being written
    source = FileSource(str(tmp_path), format="json", monitor_interval=0.001)
    source.open(0, 1)
    first, position = read_all(source, limit=23)
    source.close()
    again = FileSource(str(tmp_path), format="json", monitor_interval=0.001)
    again.open(0, 1)
    write(tmp_path, "in-5.json", [[5, n] for n in range(3)])
    rest, _ = read_all(again, position=position)
    rest += read_all(again)[0]
    assert sorted(first + rest) == sorted([(i, n) for i in range(4) for n in range(10)] + [(5, n) for n in range(3)])
    assert len(first) == 23 and again.files_pending() == 0


def test_bounded_csv_ends_after_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("key,n\nx,1\ny,2\n")
    source = FileSource(str(tmp_path), format="csv", bounded=True)
    source.open(0, 1)
    rows, _ = read_all(source)
    assert rows == [{"key": "x", "n": "1"}, {"key": "y", "n": "2"}]
    assert source.read_batch(10) is None


def test_every_file_is_read_once_across_a_rescale_from_two_to_three(tmp_path: Path) -> None:
    """Two subtasks read part of their files; their positions are dealt to three (connectors/splits.py) and the
    readers go on, new files included: every record once."""
    from runtime.connectors.splits import SplitReader, deal_splits

    expected = []
    for i in range(6):
        rows = [[i, n] for n in range(10)]
        write(tmp_path, f"in-{i}.json", rows)
        expected += [tuple(r) for r in rows]
    states, first = [], []
    for subtask in range(2):
        source = FileSource(str(tmp_path), monitor_interval=0.001)
        source.open(subtask, 2)
        got, position = read_all(source, limit=13)
        first += got
        states.append([position, 0])
    write(tmp_path, "in-7.json", [[7, 0]])
    expected.append((7, 0))
    rest = []
    for subtask, state in enumerate(deal_splits(states, 3)):
        reader = SplitReader(FileSource(str(tmp_path), monitor_interval=0.001))
        reader.open(subtask, 3)
        reader.restore(state[0])
        for _ in range(1000):
            batch = reader.read_batch(7)
            if batch is None or (not batch and all(s.files_pending() == 0 for s in reader.sources())):
                break
            rest += batch
    assert sorted(first + rest) == sorted(expected)


def test_parquet_objects_under_an_s3_prefix_are_read_once_across_a_restore_and_new_ones_picked_up() -> None:
    """The test S3 server (moto's, a process of its own): Parquet objects under a prefix, `columns` picking
    two of three in the order asked, a restore from a position inside an object, an object uploaded after it;
    a bucket that is not there is one line at submit."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from runtime.common import objectstore
    from tests.support.object_store import running_s3

    def upload(root: str, name: str, rows: list[tuple[int, int]]) -> None:
        out = io.BytesIO()
        pq.write_table(pa.table({"k": [r[0] for r in rows], "n": [r[1] for r in rows],
                                 "pad": ["x"] * len(rows)}), out)
        objectstore.write(objectstore.join(root, name), out.getvalue())

    with running_s3() as s3:
        s3.create_bucket("lake")
        root = "s3://lake/in"
        for i in range(3):
            upload(root, f"part-{i}.parquet", [(i, n) for n in range(10)])
        upload(root, "_tmp/part-9.parquet", [(9, 9)])  # hidden: in progress
        source = FileSource(root, format="parquet", monitor_interval=0.001, columns=["n", "k"])
        source.check_config()
        source.open(0, 1)
        first, position = read_all(source, limit=15)
        source.close()
        upload(root, "part-3.parquet", [(3, n) for n in range(4)])
        again = FileSource(root, format="parquet", monitor_interval=0.001, columns=["n", "k"])
        again.open(0, 1)
        rest, _ = read_all(again, position=position)
        expected = [(n, i) for i in range(3) for n in range(10)] + [(n, 3) for n in range(4)]
        assert sorted(first + rest) == sorted(expected)
        assert len(first) == 15 and again.files_pending() == 0 and again.files_read == 3  # 1 was done before
        with pytest.raises(ValueError) as missing:
            FileSource("s3://no-such-bucket/in", format="parquet").check_config()
        assert str(missing.value).startswith("FileSource s3://no-such-bucket/in: ") and "\n" not in str(missing.value)
