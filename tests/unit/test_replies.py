"""The RPC replies as typed values (runtime/graph/replies.py): each is exactly the document its handler sent
before it had a type (old peers and tests that read dicts see no change), survives msgpack, keeps keys it does
not know, and one that does not fit is refused naming the field. `protocol.call` round-trips over a real link
to the coordinator's own handler table."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from coordinator.jobs import JobRecord
from coordinator.server import Coordinator, CoordinatorConfig
from netstack.errors import JobNotFound
from netstack.transport import Link
from runtime.common.dispatch import BadArguments, typed_handlers
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.job_config import JobConfig
from tests.support.loopback import Net, Recorder

VERTICES = [{"name": "count", "parallelism": 2}]

# each reply beside the document its handler wrote by hand before replies had types
LEGACY: list[tuple[r.Reply, dict[str, Any]]] = [
    (r.Ok(), {"ok": True}),
    (r.Ok(ignored=True), {"ignored": True}),
    (r.Submitted("job-1", 4), {"job_id": "job-1", "tasks": 4}),
    (r.Cancelled("CANCELLED"), {"state": "CANCELLED"}),
    (r.Cancelled("CANCELLED", savepoint="/sp/savepoint-3", checkpoint_id=3),
     {"state": "CANCELLED", "savepoint": "/sp/savepoint-3", "checkpoint_id": 3}),
    (r.CheckpointDone("ABORTED", reason="job stopped"), {"status": "ABORTED", "reason": "job stopped"}),
    (r.CheckpointDone("ABORTED", 6, reason="declined"),
     {"checkpoint_id": 6, "status": "ABORTED", "reason": "declined"}),
    (r.CheckpointDone("COMPLETED", 5, path="/c/chk-5"),
     {"checkpoint_id": 5, "status": "COMPLETED", "path": "/c/chk-5"}),
    (r.CheckpointList("job-1", [{"checkpoint_id": 5, "status": "COMPLETED"}], [{"checkpoint_id": 5, "path": "/c"}]),
     {"job_id": "job-1", "history": [{"checkpoint_id": 5, "status": "COMPLETED"}],
      "retained": [{"checkpoint_id": 5, "path": "/c"}], "last_completed": None}),
    (r.Rescaled("job-1", 2, 0.25, VERTICES, checkpoint_id=7, requested_checkpoint_id=7, inflight_bytes=None,
                mode="aligned"),
     {"job_id": "job-1", "attempt": 2, "downtime_s": 0.25, "checkpoint_id": 7, "requested_checkpoint_id": 7,
      "inflight_bytes": None, "mode": "aligned", "vertices": VERTICES}),
    (r.Upgraded("job-2", "job-1", "/sp/savepoint-4", 4, 0.5, 1.25, VERTICES),
     {"job_id": "job-2", "previous_job_id": "job-1", "savepoint": "/sp/savepoint-4", "checkpoint_id": 4,
      "savepoint_s": 0.5, "downtime_s": 1.25, "vertices": VERTICES}),
    (r.ProbeResult(3, False, 4, [], duration_s=None),
     {"probe_id": 3, "complete": False, "tasks_total": 4, "duration_s": None, "tasks": []}),
    (r.LogLines(["started"], worker_id="w-1"), {"worker_id": "w-1", "lines": ["started"]}),
    (r.Deployed(["1:0", "2:0"]), {"tasks": ["1:0", "2:0"]}),
    (r.Profile("w-1", 5, 100, 7, [["MainThread", None, "run (a.py:1)", 7]]),
     {"worker_id": "w-1", "seconds": 5, "rate_hz": 100, "samples": 7, "dropped_samples": 0,
      "stacks": [["MainThread", None, "run (a.py:1)", 7]]}),
    (r.Started(2), {"started": 2}),
    (r.CancelledHere(False), {"cancelled": False}),
    (r.SourcesReached(1), {"sources": 1}),
    (r.Notified(0), {"tasks": 0}),
    (r.ClusterOverview([], [{"job_id": "job-1", "name": "n", "state": "RUNNING", "error": ""}],
                       coordinator={"id": "c-1", "epoch": 2, "recovered_jobs": 0}),
     {"coordinator": {"id": "c-1", "epoch": 2, "recovered_jobs": 0}, "workers": [],
      "jobs": [{"job_id": "job-1", "name": "n", "state": "RUNNING", "error": ""}]}),
]


@pytest.mark.parametrize(("reply", "legacy"), LEGACY, ids=lambda v: type(v).__name__)
def test_a_reply_is_the_document_its_handler_always_sent(reply: r.Reply, legacy: dict[str, Any]) -> None:
    assert reply.to_wire() == legacy
    wire = msgpack.unpackb(msgpack.packb(legacy), strict_map_key=False)
    assert type(reply).from_wire(wire) == reply


def test_a_job_summary_reads_and_writes_back_the_records_whole_summary() -> None:
    job = JobRecord("job-1", "m:build", "count", "", JobConfig())
    job.final_checkpoint_id = 9
    summary = {**job.summary(), "scaling": {"reason": "waiting for slots"}}  # as `status` adds it
    typed = r.JobSummary.from_wire(msgpack.unpackb(msgpack.packb(summary)))
    assert (typed.job_id, typed.state, typed.final_checkpoint_id, typed.error) == ("job-1", "CREATED", 9, "")
    assert typed.scaling == {"reason": "waiting for slots"}
    assert typed.to_wire() == summary


def test_keys_a_reply_does_not_know_are_kept_and_sent_back() -> None:
    newer = {"job_id": "job-1", "tasks": 4, "queued_behind": 2}  # a newer coordinator's extra key
    typed = r.Submitted.from_wire(newer)
    assert typed == r.Submitted("job-1", 4, extra={"queued_behind": 2})
    assert typed.to_wire() == newer


@pytest.mark.parametrize(("kind", "doc", "field"), [
    (r.Submitted, {"job_id": "job-1"}, "tasks"),
    (r.Submitted, {"job_id": 7, "tasks": 1}, "job_id"),
    (r.Rescaled, {"job_id": "j", "attempt": 1, "downtime_s": "long", "vertices": []}, "downtime_s"),
    (r.CheckpointDone, {"checkpoint_id": 1}, "status"),
    (r.JobSummary, {"job_id": "j", "name": "n", "state": "RUNNING", "tasks_total": 1, "tasks_finished": "0",
                    "tasks": []}, "tasks_finished"),
])
def test_a_reply_that_does_not_fit_is_refused_naming_the_field(kind: type[r.Reply], doc: dict[str, Any],
                                                                field: str) -> None:
    with pytest.raises(r.BadReply, match=f"{kind.__name__}: '{field}'"):
        kind.from_wire(doc)
    with pytest.raises(r.BadReply, match="must be an object"):
        kind.from_wire(["not", "a", "reply"])


def test_every_request_names_its_reply() -> None:
    requests = [kind for _, kind in inspect.getmembers(p, inspect.isclass)
                if issubclass(kind, p.Message) and getattr(kind, "method", "")]
    assert len(requests) >= 30
    for kind in requests:
        if kind is p.Status:  # the handler's decode of JobStatus and Overview: the answer depends on job_id
            assert (p.Status("j").reply_type(), p.Status().reply_type()) == (r.JobSummary, r.ClusterOverview)
            continue
        assert issubclass(kind.reply, r.Reply), kind.__name__
    assert p.JobStatus("j").to_wire() == p.Status("j").to_wire() and p.Overview().to_wire() == {}


# -- over a real link, into the coordinator's handler table -----------------------------------------------------


class CoordinatorOnLoopback(Recorder):
    """Serves a real Coordinator's RPC surface (its handler table) on a loopback link."""

    def __init__(self, coordinator: Coordinator) -> None:
        super().__init__()
        self.coordinator = coordinator

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        return await self.coordinator.on_rpc(link, method, args)


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    n = Net()
    try:
        yield n
    finally:
        await n.aclose()


async def test_call_returns_the_typed_reply_and_a_dict_sender_gets_the_same_document(tmp_path: Path,
                                                                                       net: Net) -> None:
    coordinator = Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path)))
    coordinator.leading = lambda: True  # type: ignore[method-assign]  # no lease needed to answer
    port = await net.serve(CoordinatorOnLoopback(coordinator))
    link = await net.dial(port, local_id="w-1")  # dials as a worker
    ok = await p.call(link, p.Register(slots=2, host="127.0.0.1", data_port=7000, id="w-1"), timeout_s=10.0)
    assert ok == r.Ok()
    assert await p.call(link, p.Heartbeat("w-1"), timeout_s=10.0) == r.Ok()
    overview = await p.call(link, p.Overview(), timeout_s=10.0)
    assert isinstance(overview, r.ClusterOverview)
    assert [w["id"] for w in overview.workers] == ["w-1"] and overview.jobs == []
    legacy = await asyncio.wait_for(link.call("status", {}), 10.0)  # an old client's hand-written call

    def timeless(document: dict) -> dict:  # the time since the heartbeat moves between the two calls
        return {**document, "workers": [{k: v for k, v in w.items() if k != "last_heartbeat_s_ago"}
                                        for w in document["workers"]]}

    assert timeless(legacy) == timeless(overview.to_wire())
    assert set(legacy["workers"][0]) == set(overview.workers[0])
    with pytest.raises(JobNotFound, match="no job job-404"):
        await p.call(link, p.JobStatus("job-404"), timeout_s=10.0)


def test_a_handler_table_is_built_from_message_types_and_refuses_a_method_twice() -> None:
    table = typed_handlers([(p.Cancel, lambda link, m: r.Cancelled("CANCELLED")),
                            (p.Submit, lambda link, m: r.Submitted("job-1", len(m.entry)))])
    assert sorted(table) == ["cancel", "submit"]
    assert table["submit"](None, {"entry": "m:f"}) == r.Submitted("job-1", 3)  # decoded into its message first
    with pytest.raises(BadArguments, match="submit: 'entry'"):
        table["submit"](None, {"entry": 3})
    with pytest.raises(ValueError, match="'cancel' registered twice"):
        typed_handlers([(p.Cancel, lambda link, m: None), (p.CancelJob, lambda link, m: None)])
