"""The coordinator's per-task work made cheaper for 1,000-task jobs (docs/BENCHMARKS.md, "Scale"): `_metadata` in
compact JSON (older indented files still verify), checkpoint figures summed once per ack count, and heartbeat
samples that share their window's points instead of copying them."""

from __future__ import annotations

import json
import os

import pytest

from coordinator.checkpointing import CheckpointCoordinator, CheckpointSettings, Status
from coordinator.rest_views import task_sample
from coordinator.storage import METADATA_FILE, CorruptCheckpoint, LocalCheckpointStorage
from runtime.common.checkpoint_metadata import FORMAT_VERSION, body_mismatch, encode_metadata
from runtime.common.checksums import checksum
from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures


def doc(tasks: int = 3) -> dict:
    return {"format": FORMAT_VERSION, "checkpoint_id": 7, "savepoint": False, "mode": "aligned",
            "acks": {f"0:{i}": {"state": {"state": f"0-{i}.state"}, "figures": {"state_bytes": 10 * i}}
                     for i in range(tasks)}}


def legacy_bytes(d: dict) -> bytes:
    """`_metadata` as written before the body was compact: indented by one space, body and file alike."""
    body = json.dumps(d, indent=1, sort_keys=True).encode()
    return json.dumps({**d, "checksum": checksum(body)}, indent=1, sort_keys=True).encode()


def test_metadata_round_trips_compact_and_verifies():
    data = encode_metadata(doc())
    assert b"\n" not in data  # compact: json's C encoder wrote it
    read = json.loads(data)
    recorded = read.pop("checksum")
    assert read == doc() and body_mismatch(read, recorded) is None


@pytest.mark.parametrize("encode", [encode_metadata, legacy_bytes], ids=["compact", "legacy-indented"])
def test_a_changed_document_fails_verification_in_either_form(encode):
    read = json.loads(encode(doc()))
    recorded = read.pop("checksum")
    assert body_mismatch(read, recorded) is None
    read["acks"]["0:1"]["state"]["state"] = "0-9.state"
    assert body_mismatch(read, recorded) is not None


def test_storage_reads_a_legacy_indented_file_and_refuses_a_tampered_one(tmp_path):
    storage = LocalCheckpointStorage(str(tmp_path / "state"))
    path = storage.checkpoint_dir("job-a", 1)
    with open(os.path.join(path, METADATA_FILE), "wb") as f:
        f.write(legacy_bytes(doc()))
    assert storage.read_metadata(path).acks == doc()["acks"]
    with open(os.path.join(path, METADATA_FILE), "wb") as f:
        f.write(legacy_bytes(doc()).replace(b'"0-2.state"', b'"0-5.state"'))
    with pytest.raises(CorruptCheckpoint, match="corrupt"):
        storage.read_metadata(path)


def test_checkpoint_figures_follow_every_ack_and_stay_once_complete():
    tasks = [f"0:{i}" for i in range(4)]
    cc = CheckpointCoordinator(CheckpointSettings(None), frozenset(tasks), now=0.0)
    cid, _ = cc.request(0.0)
    figures = [TaskCheckpointFigures(state_bytes=100 * (i + 1), alignment_s=0.1 * i) for i in range(4)]
    for n, (task, f) in enumerate(zip(tasks, figures, strict=True), start=1):
        cc.ack(1.0, cid, task, {}, f)
        assert cc.history()[-1].figures == CheckpointFigures.of(figures[:n])  # a new ack shows at once
        assert cc.history()[-1].figures == CheckpointFigures.of(figures[:n])  # and again, from the cache
    cc.metadata_written(2.0, cid)
    last = cc.history()[-1]
    assert last.status == Status.COMPLETED and last.figures.state_bytes == 1000
    assert cc.statistics().last_completed == last


def test_a_heartbeat_sample_leaves_the_previous_sample_as_it_was():
    report = {"task": "j/0:0", "records_in": 0, "measured_at": 0.0}
    first = task_sample(None, report, 0.0)
    second = task_sample(first, {**report, "records_in": 10, "measured_at": 1.0}, 1.0)
    third = task_sample(second, {**report, "records_in": 30, "measured_at": 2.0}, 2.0)
    assert [p[0] for p in first["window"]] == [0.0]
    assert [p[0] for p in second["window"]] == [0.0, 1.0]
    assert [p[0] for p in third["window"]] == [0.0, 1.0, 2.0]
    assert third["records_in_per_s"] == pytest.approx(15.0)
