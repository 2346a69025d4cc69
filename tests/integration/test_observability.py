"""Where time goes, seen from outside, on one real cluster (a coordinator exporting over OTLP to a receiver of the
test's, one worker) running a job whose map spends its time in one uniquely named function:

- a profile of the worker through the REST API (py-spy on the worker's process) finds that function on the map's
  task threads, while a second profile of the same worker is refused and the worker goes on serving;
- the coordinator's traces: every checkpoint is a `checkpoint` span whose duration is the one the REST API
  reports and which lies within the checkpoint call the test timed, with a `checkpoint.task` span per task and
  its alignment, sync and async phases below it; a restart (a failure injected at an exact record) is a
  `recovery` span as long as the restart time the REST API reports; the metrics arrive as OTLP series.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from coordinator.rest import UI_DIR
from tests.support.cluster import Cluster, poll, reaped_cluster, write_module
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver

JOB = '''
import os
from runtime.api import DiscardSink, GeneratorSource, Job

FAIL = %(fail)r  # the test creates it; the first record that sees it removes it and fails its task


def sluice_profile_target_spin(record):
    total = 0
    for i in range(4000):  # a fixed CPU cost per record: where the map's time goes
        total += i * i
    if os.path.exists(FAIL):
        try:
            os.remove(FAIL)
        except FileNotFoundError:  # the other subtask took it
            return (record[0], total)
        raise RuntimeError("injected failure")
    return (record[0], total)


def build(job: Job) -> None:
    # paced well below what the map can take: no backpressure, so aligned checkpoints are quick
    (job.source(GeneratorSource(count=None, keys=100, seed=3, records_per_second=2000), parallelism=1)
        .rebalance()
        .map(sluice_profile_target_spin, parallelism=2)
        .sink(DiscardSink(), parallelism=1))
'''


@dataclass
class Observed:
    cluster: Cluster
    receiver: OtlpReceiver
    job_id: str
    http: str
    fail: Path

    def get(self, path: str, timeout_s: float = 60.0) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    with otlp_receiver() as receiver, reaped_cluster(tmp_path_factory.mktemp("observe")) as cluster:
        cluster.start(1, "--otlp-endpoint", receiver.endpoint, "--otlp-interval", "1s")
        assert cluster.coordinator is not None
        fail = cluster.tmp_path / "fail-now"
        write_module(cluster.tmp_path, "spinjob", JOB % {"fail": str(fail)})
        job_id = cluster.submit("spinjob:build", {"checkpoint": {"interval_s": 0.5},
                                                  "restart": {"kind": "fixed", "delay_s": 0.2}})
        yield Observed(cluster, receiver, job_id, cluster.coordinator.fields["http"], fail)


def _records_out(observed: Observed) -> int:
    _, graph = observed.get(f"/api/v1/jobs/{observed.job_id}/graph")
    return sum(s["records_out"] for v in graph["vertices"] for s in v["subtasks"])


@pytest.mark.integration
def test_a_profile_of_the_worker_finds_the_maps_busy_function_on_its_task_threads(observed: Observed) -> None:
    poll(lambda: _records_out(observed) > 0, 60, "records flowing", interval_s=0.2)
    _, workers = observed.get("/api/v1/workers")
    worker_id = workers["workers"][0]["worker_id"]
    path = f"/api/v1/workers/{worker_id}/profile"
    answers: list[tuple[int, Any]] = []
    first = threading.Thread(target=lambda: answers.append(observed.get(f"{path}?seconds=3")))
    first.start()
    try:
        # once the first profile has begun (the worker logs it, its page shows the line), a second is refused
        poll(lambda: "py-spy profiles this worker for 3 s" in "\n".join(
            observed.get(f"/api/v1/workers/{worker_id}?lines=50")[1]["log"]), 20, "the first profile to begin",
            interval_s=0.1)
        second = observed.get(f"{path}?seconds=1")
    finally:
        first.join(timeout=60)
    assert answers, "the first profile never answered"
    assert second == (409, {"error": "this worker is being profiled already: one profile at a time",
                            "type": "ProfileInProgress"})
    code, profile = answers[0]
    assert code == 200, profile
    doc = json.loads((UI_DIR / "openapi.json").read_text())
    responses = doc["paths"]["/api/v1/workers/{worker_id}/profile"]["get"]["responses"]
    for status, body in (("200", profile), ("409", second[1])):  # as the OpenAPI document promises
        schema = responses[status]["content"]["application/json"]["schema"]
        jsonschema.validate(body, {**schema, "components": doc["components"]})
    assert profile["worker_id"] == worker_id and profile["seconds"] == 3 and profile["rate_hz"] == 100
    assert profile["samples"] > 0 and profile["samples"] == (
        sum(s["samples"] for s in profile["stacks"]) + profile["dropped_samples"])
    spinning = [s for s in profile["stacks"] if any(f.startswith("sluice_profile_target_spin ") for f in s["frames"])]
    share = sum(s["samples"] for s in spinning) / profile["samples"]
    assert share > 0, [s["frames"][-3:] for s in profile["stacks"][:10]]
    print(f"profile: {share:.0%} of {profile['samples']} samples in sluice_profile_target_spin")
    # attributed to the map's task threads ("sluice-task <job>/<vertex>:<subtask>"), never to another thread
    map_tasks = {s["task"] for s in spinning}
    assert map_tasks and all(t is not None and t.startswith(f"{observed.job_id}/") for t in map_tasks), map_tasks
    assert all(s["thread"] == f"sluice-task {s['task']}" for s in spinning)
    threads = {t["thread"]: t for t in profile["threads"]}
    assert all(threads[s["thread"]]["task"] == s["task"] for s in spinning)
    # out of bounds, or an unknown worker: refused with one line; the worker serves all along
    assert observed.get(f"{path}?seconds=31")[0] == 400
    assert observed.get("/api/v1/workers/nobody/profile?seconds=1")[0] == 404
    status, page = observed.get(f"/api/v1/workers/{worker_id}?lines=5")
    assert status == 200 and page["worker_id"] == worker_id
    _, job = observed.get(f"/api/v1/jobs/{observed.job_id}")
    assert job["state"] == "RUNNING" and job["attempt"] == 0


def _spans(observed: Observed, name: str) -> list[ReceivedSpan]:
    return [s for s in observed.receiver.spans() if s.name == name]


def _checkpoint(observed: Observed) -> tuple[dict[str, Any], float, float]:
    """A checkpoint the test asks for through the REST API, and the wall clock before the call and after it."""
    request = urllib.request.Request(f"http://{observed.http}/api/v1/jobs/{observed.job_id}/checkpoints",
                                     data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {observed.cluster.token}",
                                              "Content-Type": "application/json"})
    deadline = time.monotonic() + 90
    while True:  # a loaded machine may have the job restarting (its map spins): 409 until it runs again
        before = time.time()
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                answer = json.loads(resp.read())
            return answer, before, time.time()
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            if err.code != 409 or time.monotonic() > deadline:
                raise AssertionError(f"checkpoint refused: {err.code} {body}") from None
            print(f"checkpoint refused, asking again: {body}")
            time.sleep(0.5)


@pytest.mark.integration
def test_checkpoints_and_a_recovery_are_traced_over_otlp_as_the_rest_api_measures_them(observed: Observed) -> None:
    answer, before, after = _checkpoint(observed)
    assert answer["status"] == "COMPLETED", answer
    checkpoint_id = answer["checkpoint_id"]

    def root_of(cid: int) -> ReceivedSpan | None:
        return next((s for s in _spans(observed, "checkpoint") if s.attributes["sluice.checkpoint.id"] == cid), None)

    poll(lambda: root_of(checkpoint_id) is not None, 30, f"the span of checkpoint {checkpoint_id}", interval_s=0.2)
    _, checkpoints = observed.get(f"/api/v1/jobs/{observed.job_id}/checkpoints")
    by_id = {c["checkpoint_id"]: c for c in checkpoints["history"]}
    root = root_of(checkpoint_id)
    assert root is not None
    rest = by_id[checkpoint_id]
    # the span is the checkpoint as the REST API reports it, and lies within the call the test timed
    assert root.parent_span_id == "" and root.status_code == 0
    _, job = observed.get(f"/api/v1/jobs/{observed.job_id}")
    # attempt 0 unless a loaded machine restarted the job before (the checkpoint was asked until it ran)
    assert root.attributes["sluice.job.id"] == observed.job_id
    assert root.attributes["sluice.job.attempt"] == job["attempt"]
    assert root.attributes["sluice.checkpoint.status"] == "COMPLETED"
    assert abs(root.duration_s - rest["duration_s"]) < 1e-4, (root.duration_s, rest["duration_s"])
    assert abs(root.start_ns / 1e9 - rest["started_at"]) < 2e-3  # the REST API rounds it to the millisecond
    assert before - 1e-3 <= root.start_ns / 1e9 and root.end_ns / 1e9 <= after + 1e-3
    assert root.resource["service.name"] == "sluice-coordinator"

    # a span per task that acknowledged, under the checkpoint, carrying the figures the REST API shows
    in_trace = [s for s in observed.receiver.spans() if s.trace_id == root.trace_id]
    tasks = [s for s in in_trace if s.name == "checkpoint.task"]
    rest_tasks = {t["task"]: t for t in rest["tasks"]}
    assert sorted(s.attributes["sluice.task"] for s in tasks) == sorted(rest_tasks) == ["0:0", "1:0", "1:1", "2:0"]
    for task in tasks:
        assert task.parent_span_id == root.span_id
        assert root.start_ns <= task.start_ns <= task.end_ns <= root.end_ns
        figures = rest_tasks[task.attributes["sluice.task"]]
        for name in ("start_delay_s", "alignment_s", "sync_s", "async_s", "state_bytes", "inflight_bytes"):
            assert task.attributes[f"sluice.checkpoint.{name}"] == figures[name], name
        phases = {s.name: s for s in in_trace if s.parent_span_id == task.span_id}
        assert sorted(phases) == ["checkpoint.alignment", "checkpoint.async", "checkpoint.sync"]
        for phase in phases.values():
            assert task.start_ns <= phase.start_ns <= phase.end_ns <= task.end_ns
        assert abs(phases["checkpoint.sync"].duration_s - figures["sync_s"]) < 1e-4

    # every other completed checkpoint is traced with the duration the REST API reports
    poll(lambda: len(_spans(observed, "checkpoint")) >= 3, 30, "three checkpoint spans", interval_s=0.2)
    for span in _spans(observed, "checkpoint"):
        entry = by_id.get(span.attributes["sluice.checkpoint.id"])
        if entry is not None and entry["status"] == "COMPLETED":
            assert abs(span.duration_s - entry["duration_s"]) < 1e-4

    # a failure injected at the next record: one `recovery` span, as long as the restart the REST API reports
    def restart_times() -> list[float]:
        return list(observed.get(f"/api/v1/jobs/{observed.job_id}/restarts")[1]["restart_s"])

    earlier = len(restart_times())  # 0 unless a loaded machine restarted the job before
    observed.fail.write_text("now")
    poll(lambda: len(restart_times()) > earlier, 60, "the restart", interval_s=0.2)
    restart_s = restart_times()[earlier]

    def recoveries() -> list[ReceivedSpan]:
        return [s for s in _spans(observed, "recovery") if s.attributes["sluice.job.attempt"] == earlier + 1]

    poll(recoveries, 30, "the recovery span", interval_s=0.2)
    [recovery] = recoveries()
    assert recovery.parent_span_id == ""
    assert abs(recovery.duration_s - restart_s) < 1e-4
    assert "injected failure" in recovery.attributes["sluice.recovery.cause"]

    # the metrics, beside Prometheus: the same series over OTLP
    def completed_points() -> list[float]:
        return [p.value for p in observed.receiver.points() if p.metric == "sluice_checkpoints_completed"]

    poll(lambda: completed_points() and max(completed_points()) >= 3, 30, "checkpoint counts over OTLP",
         interval_s=0.2)
    sums = [p for p in observed.receiver.points() if p.metric == "sluice_checkpoints_completed"]
    assert all(p.kind == "sum" and p.monotonic for p in sums)
    registered = [p.value for p in observed.receiver.points() if p.metric == "sluice_workers_registered"]
    assert registered and registered[-1] == 1.0
    assert observed.receiver.bad_requests == []
