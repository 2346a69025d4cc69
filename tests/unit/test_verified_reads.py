"""Every checkpoint read is verified and confined (issue 31).

One verified read (runtime/common/checksums.read_checked) serves the coordinator's verification, a task's
restore and the state processor (`sluice data state read|transform`): a flipped byte in a value-state file or a
channel-state file is refused by each of them with one line naming the file, and `transform` writes nothing.
Names a forged `_metadata` records (`..`, absolute) are refused before anything is read, and the refusal says
nothing about the outside file; a sink's restored state cannot rename or publish outside what the sink owns.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from coordinator.storage import CorruptCheckpoint, LocalCheckpointStorage
from runtime.checkpointing.snapshots import CorruptState, decode_operator_state, encode_channel_state, keyed_tables
from runtime.common import objectstore
from runtime.common.checksums import checksum
from runtime.connectors.files import FileSink
from runtime.connectors.nats import NatsSink
from runtime.connectors.sinks import ForgedSinkState
from runtime.data.checkpoint_state import (
    graph_of_job,
    open_checkpoint,
    savepoint_from_entries,
    state_rows,
    target_in,
    transform,
    write_savepoint,
)
from runtime.data.spark import DataError
from runtime.state.files import SnapshotStore
from runtime.worker.restoring import read_channel_state, read_operator_state

JOB = '''
from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        self.count.update(self.count.value() + 1)


def build(job: Job) -> None:
    (job.source(GeneratorSource(count=10, keys=5, seed=1), parallelism=1).uid("src")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=1).uid("counts")
        .sink(DiscardSink(), parallelism=1))
'''


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"vrjob_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(JOB)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:build"


def sluice_state(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "data", "state", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
                          text=True, timeout=120)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def refused_everywhere(tmp_path: Path, checkpoint: Path, name: str, kind: str) -> None:
    """The coordinator's verification, a task's restore, `state read` and `state transform` all refuse the
    checkpoint with one line naming file `name`; nothing is written."""
    storage = LocalCheckpointStorage(str(tmp_path))
    with pytest.raises(CorruptCheckpoint, match=rf"{name}: checkpoint file of task \d+:0 is corrupt: CRC-32"):
        storage.verify(str(checkpoint), storage.read_metadata(str(checkpoint)))
    cp = open_checkpoint(str(checkpoint))
    restore = read_operator_state if kind == "value" else read_channel_state
    with pytest.raises(CorruptState, match=rf"{name}: checkpoint file is corrupt: CRC-32"):
        restore(str(checkpoint), name, cp.expected(name))
    with pytest.raises(DataError, match=rf"{name}: checkpoint file is corrupt"):
        list(state_rows(cp, "counts", kind))
    with pytest.raises(DataError, match=rf"{name}: checkpoint file is corrupt"):
        transform(cp, str(tmp_path / "t"), drop=["src"])
    line = one_line(sluice_state(tmp_path, "read", str(checkpoint), "--uid", "counts", "--kind", kind, "-o", "rows"))
    assert f"{name}: checkpoint file is corrupt: CRC-32" in line
    line = one_line(sluice_state(tmp_path, "transform", str(checkpoint), "--drop", "src", "-o", "t"))
    assert f"{name}: checkpoint file is corrupt: CRC-32" in line
    assert not (tmp_path / "rows").exists() and not (tmp_path / "t").exists()


def test_a_flipped_value_in_a_state_file_is_refused_by_restore_read_and_transform(tmp_path: Path, job: str) -> None:
    graph, mp = graph_of_job(job)
    out = tmp_path / "sp"
    savepoint_from_entries(str(out), [("count", "k", 366)], target_in(graph, "counts", mp, "job"), graph,
                           entry=job, name="job")
    (state_file,) = out.glob("*.state")
    data = state_file.read_bytes()
    assert data.count(msgpack.packb(366)) == 1
    state_file.write_bytes(data.replace(msgpack.packb(366), msgpack.packb(367)))
    # the flipped file still decodes, to the wrong count: only its checksum tells
    flipped = keyed_tables(decode_operator_state(state_file.read_bytes(), state_file.name))
    assert [t["count"] for t in flipped.values()] == [{"k": 367}]
    refused_everywhere(tmp_path, out, state_file.name, "value")


def test_a_flipped_key_in_a_channel_state_file_is_refused_by_restore_read_and_transform(
        tmp_path: Path, job: str) -> None:
    graph, _ = graph_of_job(job)
    vertex = next(o["vertex"] for o in graph["operators"] if o["uid"] == "counts")
    stream = b"".join(msgpack.packb(["key-a", i]) for i in range(5))
    files = {"1-0.in": encode_channel_state("in", {"0:0:0": stream})}
    acks = {f"{vertex}:0": {"state": {"in": "1-0.in", "checksums": {n: checksum(d) for n, d in files.items()}}}}
    write_savepoint(str(tmp_path / "cp"), files, {"checkpoint_id": 4, "acks": acks, **graph})
    path = tmp_path / "cp" / "1-0.in"
    path.write_bytes(path.read_bytes().replace(b"key-a", b"key-b", 1))
    refused_everywhere(tmp_path, tmp_path / "cp", "1-0.in", "channels")


@pytest.mark.parametrize("name", ["../../../outside/secret", "/ABSOLUTE"])
def test_a_forged_metadata_naming_a_file_outside_is_refused_without_reading_it(
        tmp_path: Path, job: str, name: str) -> None:
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(b"x" * 4321)
    if name == "/ABSOLUTE":
        name = str(secret)
    graph, _ = graph_of_job(job)
    vertex = next(o["vertex"] for o in graph["operators"] if o["uid"] == "counts")
    # a forger can recompute every checksum; here it even records a wrong one, to fish for the real size and CRC
    acks = {f"{vertex}:0": {"state": {"state": name, "checksums": {name: {"crc32": 1, "size": 1}}}}}
    cp_dir = tmp_path / "checkpoints" / "job" / "chk-1"
    write_savepoint(str(cp_dir), {}, {"checkpoint_id": 1, "acks": acks, **graph})
    storage = LocalCheckpointStorage(str(tmp_path))
    messages = []
    with pytest.raises(CorruptCheckpoint) as refused:
        storage.verify(str(cp_dir), storage.read_metadata(str(cp_dir)))
    messages.append(str(refused.value))
    with pytest.raises(CorruptState) as refused_restore:
        read_operator_state(str(cp_dir), name, {"crc32": 1, "size": 1})
    messages.append(str(refused_restore.value))
    with pytest.raises(DataError) as refused_read:
        list(state_rows(open_checkpoint(str(cp_dir)), "counts", "value"))
    messages.append(str(refused_read.value))
    messages.append(one_line(sluice_state(tmp_path, "read", str(cp_dir), "--uid", "counts", "-o", "rows")))
    for message in messages:
        assert "not a name inside this directory" in message and "\n" not in message
        # nothing about the outside file: not its size, not a CRC, not that it exists
        assert "4321" not in message and "CRC" not in message and "bytes" not in message, message
    # a state backend's handle and the shared files retention deletes are confined the same way
    with pytest.raises(objectstore.OutsideDirectory):
        SnapshotStore(str(tmp_path / "store")).read(name)
    # from <root>/checkpoints/job/shared too, where retention deletes what a discarded checkpoint released
    segments = {f"{vertex}:0": {"state": {"segments": [[name, 1, 1]]}}}
    chk2 = tmp_path / "checkpoints" / "job" / "chk-2"
    write_savepoint(str(chk2), {}, {"checkpoint_id": 2, "acks": segments, **graph})
    with pytest.raises(CorruptCheckpoint, match="not a "):
        storage.verify(str(chk2), storage.read_metadata(str(chk2)))
    storage.discard(str(chk2))
    assert secret.read_bytes() == b"x" * 4321  # the discard released nothing outside the shared directory


def test_file_sink_restore_state_pointing_outside_its_directory_is_refused_before_any_rename(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    victim.write_text("keep me")
    sink = FileSink(str(out))
    sink.open(0, 1, 1)
    good_hidden = out / ".part-0-0-0.jsonl.inprogress"
    good_hidden.write_text("[1]\n")
    good = [1, str(good_hidden), str(out / "part-0-000001-0-0.jsonl")]
    forged: list[list[Any]] = [
        [1, str(victim), str(out / "part-0-000001-0-1.jsonl")],  # moves a file in from outside
        [1, str(out / ".part-0-0-1.jsonl.inprogress"), str(tmp_path / "x" / "part-0-1-0-0.jsonl")],  # out
        [1, str(out / ".part-0-0-1.jsonl.inprogress"), str(out / ".." / "part-0-1-0-0.jsonl")],
        [1, str(out / "notes.txt"), str(out / "part-0-000001-0-1.jsonl")],  # not a part file of the sink
        ["1", str(good_hidden), str(out / "part-0-000001-0-0.jsonl")],  # malformed
        [1, str(good_hidden)],
    ]
    for entry in forged:
        with pytest.raises(ForgedSinkState, match="refused, nothing renamed") as refused:
            sink.restore_state({"pending": [good, entry], "checkpoint": 1})
        assert "victim" not in str(refused.value)
        assert victim.read_text() == "keep me" and good_hidden.exists()  # nothing touched, not even the good one
    assert ForgedSinkState.unrecoverable  # the job fails at once: no restart changes the checkpoint
    sink.restore_state({"pending": [good], "checkpoint": 1})
    assert (out / "part-0-000001-0-0.jsonl").read_text() == "[1]\n"
    sink.close()


def test_nats_sink_restore_state_for_another_subject_is_refused() -> None:
    sink = NatsSink("nats://127.0.0.1:1", "orders.out")
    sink.subtask_index = 0
    for entry in ([1, "tok", [["orders.other", b"{}"]]], [1, "tok", [["orders.out", "not bytes"]]], [1, "tok"]):
        with pytest.raises(ForgedSinkState, match="refused"):
            sink.restore_state({"pending": [[1, "tok", [["orders.out", b"{}"]]], entry]})


def test_kafka_sink_restore_state_for_another_topic_is_refused() -> None:
    from runtime.connectors.kafka_sink import KafkaSink

    sink = KafkaSink("127.0.0.1:1", "orders", transactional_id_prefix="t")
    sink.subtask_index = 0
    own = [1, 0, "tok", [["orders", None, None, b"{}", None]]]
    for entry in ([1, 0, "tok", [["payments", None, None, b"{}", None]]], [1, 0, "tok"], ["1", 0, "tok", []]):
        with pytest.raises(ForgedSinkState, match="refused"):
            sink.restore_state({"pending": [own, entry], "checkpoint": 1})
