"""Heartbeat task entries: the worker sends whole reports the first time and then only the fields that changed
(runtime/worker/heartbeat_reports.py), the coordinator rebuilds the whole reports from them
(coordinator/heartbeat_reports.py), and the Heartbeat message carries and checks both lists."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.heartbeat_reports import ReportMirror
from runtime.common.dispatch import BadArguments
from runtime.graph import protocol as p
from runtime.worker.heartbeat_reports import ReportDeltas, TaskEntries, changed_fields


def report(task: str, records_in: int, at: float, *, attempt: int = 0, state: str = "RUNNING") -> dict[str, Any]:
    return {"job": "j", "task": f"j/{task}", "attempt": attempt, "name": "count", "state": state,
            "records_in": records_in, "measured_at": at, "connectors": []}


def test_changed_fields_keeps_identity_and_changes_only() -> None:
    assert changed_fields(report("1:0", 5, 1.0), report("1:0", 9, 2.0)) == {
        "job": "j", "task": "j/1:0", "attempt": 0, "records_in": 9, "measured_at": 2.0}
    assert changed_fields(report("1:0", 5, 1.0), report("1:0", 5, 1.0)) == {"job": "j", "task": "j/1:0",
                                                                              "attempt": 0}
    assert changed_fields(None, report("1:0", 5, 1.0)) is None
    lost = report("1:0", 5, 1.0)
    del lost["connectors"]
    assert changed_fields(report("1:0", 5, 1.0), lost) is None  # a delta cannot remove a field


def test_worker_sends_whole_then_changes_then_whole_after_a_reset() -> None:
    deltas = ReportDeltas()
    first = deltas.entries([report("1:0", 0, 1.0), report("2:0", 0, 1.0)])
    assert first == TaskEntries([report("1:0", 0, 1.0), report("2:0", 0, 1.0)], [])
    deltas.confirmed()
    second = deltas.entries([report("1:0", 4, 2.0), report("2:0", 0, 1.0), report("3:0", 0, 2.0)])
    assert second == TaskEntries([report("3:0", 0, 2.0)], [
        {"job": "j", "task": "j/1:0", "attempt": 0, "records_in": 4, "measured_at": 2.0},
        {"job": "j", "task": "j/2:0", "attempt": 0}])
    # not confirmed (the call failed): whole reports again, whatever was sent
    deltas.reset()
    assert deltas.entries([report("1:0", 6, 3.0)]) == TaskEntries([report("1:0", 6, 3.0)], [])


def test_unconfirmed_heartbeat_is_not_the_base() -> None:
    deltas = ReportDeltas()
    deltas.entries([report("1:0", 0, 1.0)])
    deltas.confirmed()
    deltas.entries([report("1:0", 4, 2.0)])  # in flight, no answer yet, then the next one is computed
    assert deltas.entries([report("1:0", 4, 3.0)]).changes == [
        {"job": "j", "task": "j/1:0", "attempt": 0, "records_in": 4, "measured_at": 3.0}]


def test_new_attempt_is_a_new_task() -> None:
    deltas = ReportDeltas()
    deltas.entries([report("1:0", 7, 1.0)])
    deltas.confirmed()
    assert deltas.entries([report("1:0", 0, 2.0, attempt=1)]) == TaskEntries([report("1:0", 0, 2.0, attempt=1)], [])


def test_whole_reports_every_full_every_heartbeats() -> None:
    deltas = ReportDeltas(full_every=3)
    kinds = []
    for n in range(7):
        entries = deltas.entries([report("1:0", n, float(n))])
        deltas.confirmed()
        kinds.append("whole" if entries.whole else "changes")
    assert kinds == ["whole", "changes", "changes", "whole", "changes", "changes", "whole"]


def test_mirror_rebuilds_what_the_worker_reported() -> None:
    worker, mirror = ReportDeltas(), ReportMirror()
    beats = [[report("1:0", 0, 1.0), report("2:0", 0, 1.0)],
             [report("1:0", 3, 2.0), report("2:0", 0, 2.0)],
             [report("1:0", 3, 3.0, state="FINISHED"), report("3:0", 1, 3.0)],  # 2:0 ended here, 3:0 is new
             [report("1:0", 3, 4.0, state="FINISHED"), report("3:0", 8, 4.0)]]
    for reports in beats:
        entries = worker.entries(reports)
        applied = mirror.apply(entries.whole, entries.changes)
        worker.confirmed()
        assert sorted(applied.reports, key=lambda r: r["task"]) == reports
        assert applied.without_base == []
        assert len(mirror) == len(reports)


def test_mirror_skips_changes_without_a_base() -> None:
    mirror = ReportMirror()
    applied = mirror.apply([report("1:0", 0, 1.0)], [{"job": "j", "task": "j/9:0", "attempt": 0, "records_in": 1}])
    assert applied.reports == [report("1:0", 0, 1.0)]
    assert applied.without_base == [("j", "j/9:0", 0)]
    assert len(mirror) == 1


def test_heartbeat_wire_round_trip_and_checks() -> None:
    beat = p.Heartbeat("w-1", [report("1:0", 0, 1.0)], process=None,
                       changes=[{"job": "j", "task": "j/2:0", "attempt": 0, "records_in": 3}])
    assert p.Heartbeat.from_wire(beat.to_wire()) == beat
    assert p.Heartbeat.from_wire({"id": "w-1", "tasks": [report("1:0", 0, 1.0)]}).changes == []  # an older worker
    with pytest.raises(BadArguments, match=r"heartbeat: changes\[0\] must be an object"):
        p.Heartbeat.from_wire({"id": "w-1", "changes": ["nope"]})
    with pytest.raises(BadArguments, match=r"heartbeat: tasks\[0\] must name its job, task and attempt"):
        p.Heartbeat.from_wire({"id": "w-1", "tasks": [{"job": "j", "task": "j/1:0"}]})


def test_worker_waits_for_a_busy_coordinator_as_long_as_its_link_timeout() -> None:
    from runtime.worker.worker import COORDINATOR_CALL_TIMEOUT_S, Worker, WorkerConfig

    def timeout(link_timeout_s: float) -> float:
        config = WorkerConfig(coordinator_host="127.0.0.1", coordinator_port=1, token="t",
                              link_timeout_s=link_timeout_s)
        return Worker(config)._coordinator_call_timeout_s()

    assert COORDINATOR_CALL_TIMEOUT_S == 10.0
    assert timeout(10.0) == 10.0  # the default: as before
    assert timeout(0.0) == 10.0  # links never time out: the calls still do
    assert timeout(60.0) == 60.0
