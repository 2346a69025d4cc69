"""The coordinator's RPC payloads: every message survives msgpack, and a malformed call is refused naming the
field (InvalidRequest on the wire), before any handler runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from coordinator.server import Coordinator, CoordinatorConfig
from netstack.errors import InvalidRequest
from runtime.common.dispatch import BadArguments
from runtime.graph import protocol as p
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import CheckpointMode

MESSAGES: list[p.Message] = [
    p.Register(slots=4, host="h", data_port=7000, id="w-1", metrics_port=None, pid=12),
    p.Heartbeat("w-1", [{"job": "j", "task": "0:0", "attempt": 1}]),
    p.Heartbeat("w-1", [], process={"rss_bytes": 1 << 20, "cpu_s": 1.5, "measured_at": 10.0}),
    p.AckCheckpoint("j", 2, "1:0", 5, {"state": "1-0.state", "checksums": {"1-0.state": "x"}},
                    TaskCheckpointFigures(state_bytes=9, backend_sync_s=0.5)),
    p.DeclineCheckpoint("j", 2, "1:0", 5, "superseded"),
    p.ProbeDone("j", 2, "1:0", 3, 1, 2),
    p.TaskEnded("j", 2, "1:0"), p.TaskFinished("j", 2, "1:0", stats={"task": "1:0"}),
    p.TaskFailed("j", 2, "1:0", error="boom"), p.JobError("j", 2, error="lost"),
    p.TaskFailed("j", 2, "1:0", error="boom", traceback="Traceback (most recent call last):\n..."),
    p.WorkerLog("w-1", lines=50), p.LogTail(20), p.WorkerProfile("w-1", seconds=3), p.Profile(30),
    p.Submit(entry="m:f", config={"checkpoint": {"interval_s": 1}}), p.Status(), p.Cancel("j"),
    p.WaitJob("j", 2.5), p.Probe("j"), p.TakeCheckpoint("j", savepoint=True, directory="/sp"),
    p.Checkpoints("j"), p.Rescale("j", {"*": 3}),
    p.Deploy({"job_id": "j"}), p.StartJob("j"), p.CancelJob("j", 3), p.InjectProbe("j", 4),
    p.TriggerCheckpoint("j", 1, 5, CheckpointOptions(CheckpointMode.ALIGNED_TIMEOUT, aligned_timeout_s=0.2),
                        1700000000.5, "/c/chk-5"),
    p.TriggerCheckpoint("j", 1, 6, CheckpointOptions(CheckpointMode.UNALIGNED, full=True), 1700000001.0, "/c/chk-6"),
    p.CheckpointNotice("j", 5, attempt=1), p.CheckpointAborted("j", 5, attempt=1), p.JobStatus("j"), p.Overview(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_wire(message: p.Message) -> None:
    wire = msgpack.unpackb(msgpack.packb(message.to_wire()), strict_map_key=False)
    assert type(message).from_wire(wire) == message


@pytest.mark.parametrize(("kind", "doc", "field"), [
    (p.AckCheckpoint, {"job_id": "j", "attempt": 1, "task": "1:0", "state": {}}, "checkpoint_id"),
    (p.AckCheckpoint, {"job_id": "j", "attempt": "1", "task": "1:0", "checkpoint_id": 1, "state": {}}, "attempt"),
    (p.Register, {"slots": 2, "host": "h", "data_port": "x"}, "data_port"),
    (p.WaitJob, {"job_id": "j", "timeout_s": "soon"}, "timeout_s"),
    (p.Submit, {"config": ["not", "an", "object"]}, "config"),
    (p.Cancel, {}, "job_id"),
    (p.WorkerLog, {"worker_id": "w-1", "lines": "many"}, "lines"),
    (p.WorkerProfile, {"worker_id": "w-1", "seconds": 2.5}, "seconds"),
])
def test_a_malformed_message_is_refused_naming_the_field(kind: type[p.Message], doc: dict[str, Any],
                                                          field: str) -> None:
    with pytest.raises(BadArguments, match=f"{kind.method}: '{field}'"):
        kind.from_wire(doc)


def test_the_coordinator_refuses_a_malformed_call_as_an_invalid_request(tmp_path: Path) -> None:
    coordinator = Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path)))
    coordinator.leading = lambda: True  # type: ignore[method-assign]  # no lease needed to refuse
    with pytest.raises(InvalidRequest, match="'timeout_s'") as info:
        asyncio.run(coordinator.on_rpc(None, "wait_job", {"job_id": "j", "timeout_s": [1]}))  # type: ignore[arg-type]
    assert info.value.code == "BadArgs"
