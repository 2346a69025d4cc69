"""A worker's checkpoint acknowledgements in one call per job attempt (runtime/worker/ack_batcher.py): what a
window gathers goes together and in order, the wire form decodes to the same acknowledgements, and a malformed
one refuses the whole call naming it."""

from __future__ import annotations

import asyncio

import pytest

from runtime.common.dispatch import BadArguments
from runtime.graph import protocol as p
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.worker.ack_batcher import AckBatcher


def ack(job: str, attempt: int, task: str, checkpoint_id: int = 4) -> p.AckCheckpoint:
    return p.AckCheckpoint(job, attempt, task, checkpoint_id, {"keyed": [f"{task}.state"]},
                           TaskCheckpointFigures(sync_s=0.001, state_bytes=10))


async def test_acks_within_the_window_go_as_one_call_per_job_attempt_in_order() -> None:
    sent: list[p.AckCheckpoints] = []
    batcher = AckBatcher(sent.append, window_s=0.05)
    for a in [ack("job-a", 0, "1:0"), ack("job-b", 2, "1:0"), ack("job-a", 0, "2:1"), ack("job-a", 0, "1:1")]:
        batcher.add(a)
    assert sent == []  # nothing before the window ends
    await asyncio.sleep(0.2)
    assert [(b.job_id, b.attempt, [a.task for a in b.acks]) for b in sent] == [
        ("job-a", 0, ["1:0", "2:1", "1:1"]), ("job-b", 2, ["1:0"])]
    batcher.add(ack("job-a", 0, "1:0", checkpoint_id=5))  # a new window for the next checkpoint's
    await asyncio.sleep(0.2)
    assert [(b.job_id, [a.checkpoint_id for a in b.acks]) for b in sent[2:]] == [("job-a", [5])]


def test_the_wire_form_decodes_to_the_same_acknowledgements_and_a_bad_one_is_named() -> None:
    batch = p.AckCheckpoints("job-a", 3, [ack("job-a", 3, "1:0"), ack("job-a", 3, "2:0")])
    wire = batch.to_wire()
    assert all("job_id" not in a and "attempt" not in a for a in wire["acks"])  # said once, for all
    assert p.AckCheckpoints.from_wire(wire) == batch
    wire["acks"][1] = {**wire["acks"][1], "checkpoint_id": "four"}
    with pytest.raises(BadArguments, match="ack_checkpoint: 'checkpoint_id'"):
        p.AckCheckpoints.from_wire(wire)
    with pytest.raises(BadArguments, match=r"ack_checkpoints: acks\[0\] must be an object"):
        p.AckCheckpoints.from_wire({"job_id": "job-a", "attempt": 3, "acks": ["nope"]})
