"""The traces of checkpoints and recoveries (coordinator/trace_spans.py, pure: exact span records), the metrics
as OTLP series, and the OTLP export itself (coordinator/telemetry.py) against the tests' receiver."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from coordinator.checkpointing import CheckpointCoordinator, CheckpointSettings, CheckpointSummary, Status
from coordinator.telemetry import (
    COUNTER,
    FAILURE_REPEAT_S,
    GAUGE,
    ExportFailures,
    OtlpSettings,
    Series,
    Telemetry,
    otlp_series,
)
from coordinator.trace_spans import SpanRecord, checkpoint_span, recovery_span
from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures
from runtime.graph.enums import CheckpointMode
from tests.support.otlp_receiver import otlp_receiver

# binary fractions, so every sum below is exact
SOURCE = TaskCheckpointFigures(sync_s=0.25, async_s=0.5, state_bytes=10)
MAP = TaskCheckpointFigures(start_delay_s=0.125, first_barrier_s=0.125, last_barrier_s=0.625, alignment_s=0.5,
                            sync_s=0.25, async_s=1.0, state_bytes=30, inflight_bytes=4)
FINISHED = TaskCheckpointFigures()  # a task that had finished: acknowledged for it, nothing measured


def summary(mode: CheckpointMode = CheckpointMode.ALIGNED, status: Status = Status.COMPLETED,
            duration_s: float | None = 2.0, savepoint: bool = False, reason: str = "") -> CheckpointSummary:
    figures = CheckpointFigures.of([SOURCE, MAP])
    return CheckpointSummary(7, status, mode, savepoint, 100.0, duration_s, figures, reason)


def task_attributes(task: str, figures: TaskCheckpointFigures) -> dict[str, object]:
    return {"sluice.task": task, **{f"sluice.checkpoint.{k}": v for k, v in figures.to_wire().items()}}


def phases(task: str, alignment: tuple[float, float], sync: tuple[float, float],
           asynchronous: tuple[float, float]) -> tuple[SpanRecord, ...]:
    return (SpanRecord("checkpoint.alignment", *alignment, {"sluice.task": task}),
            SpanRecord("checkpoint.sync", *sync, {"sluice.task": task}),
            SpanRecord("checkpoint.async", *asynchronous, {"sluice.task": task}))


def test_an_aligned_checkpoint_is_a_span_with_a_span_per_task_and_its_phases_after_the_alignment() -> None:
    span = checkpoint_span(summary(), {"2:0": MAP, "1:0": SOURCE, "3:0": FINISHED}, job_id="job-1", attempt=2,
                           wall_offset_s=1000.0)
    assert span == SpanRecord(
        "checkpoint", 1100.0, 1102.0,
        {"sluice.job.id": "job-1", "sluice.job.attempt": 2, "sluice.checkpoint.id": 7,
         "sluice.checkpoint.mode": "aligned", "sluice.checkpoint.savepoint": False,
         "sluice.checkpoint.status": "COMPLETED", "sluice.checkpoint.tasks": 3,
         "sluice.checkpoint.start_delay_s": 0.125, "sluice.checkpoint.alignment_s": 0.5,
         "sluice.checkpoint.state_bytes": 40, "sluice.checkpoint.inflight_bytes": 4,
         "sluice.checkpoint.switched_channels": 0},
        (SpanRecord("checkpoint.task", 1100.0, 1100.75, task_attributes("1:0", SOURCE),
                    phases("1:0", (1100.0, 1100.0), (1100.0, 1100.25), (1100.25, 1100.75))),
         # first barrier at +0.125, aligned for 0.5, then the snapshot, then its writes until the ack
         SpanRecord("checkpoint.task", 1100.125, 1101.375, task_attributes("2:0", MAP),
                    phases("2:0", (1100.125, 1100.625), (1100.625, 1100.875), (1100.875, 1101.375)))))
    assert span.duration_s == 2.0 and [s.name for s in span.walk()][:2] == ["checkpoint", "checkpoint.task"]


def test_an_unaligned_checkpoint_snapshots_at_the_first_barrier_while_the_alignment_goes_on() -> None:
    span = checkpoint_span(summary(CheckpointMode.UNALIGNED), {"2:0": MAP}, job_id="j", attempt=0,
                           wall_offset_s=1000.0, trigger_wall_s=1100.0)
    assert span is not None
    [task] = span.children
    assert task.children == phases("2:0", (1100.125, 1100.625), (1100.125, 1100.375), (1100.375, 1101.375))


def test_task_times_measured_from_the_trigger_message_and_clipped_to_the_checkpoint() -> None:
    # the trigger left 0.5 s after the checkpoint started (its directory took that long); another machine's
    # clock would put the acknowledgement after the last one arrived: clipped to the checkpoint's end
    span = checkpoint_span(summary(duration_s=1.5), {"2:0": MAP}, job_id="j", attempt=0, wall_offset_s=1000.0,
                           trigger_wall_s=1100.5)
    assert span is not None and (span.start_s, span.end_s) == (1100.0, 1101.5)
    [task] = span.children
    assert (task.start_s, task.end_s) == (1100.625, 1101.5)
    assert task.children == phases("2:0", (1100.625, 1101.125), (1101.125, 1101.375), (1101.375, 1101.5))


def test_an_aborted_checkpoint_is_an_error_span_a_savepoint_is_named_so_one_in_progress_has_none() -> None:
    aborted = checkpoint_span(summary(status=Status.FAILED, duration_s=0.5, reason="timeout after 0.5 s"), {},
                              job_id="j", attempt=0, wall_offset_s=0.0)
    assert aborted is not None and aborted.error == "timeout after 0.5 s" and aborted.children == ()
    assert aborted.attributes["sluice.checkpoint.status"] == "FAILED"
    savepoint = checkpoint_span(summary(savepoint=True), {}, job_id="j", attempt=0, wall_offset_s=0.0)
    assert savepoint is not None and savepoint.name == "savepoint" and savepoint.error == ""
    assert checkpoint_span(summary(status=Status.IN_PROGRESS, duration_s=None), {}, job_id="j", attempt=0,
                           wall_offset_s=0.0) is None


def test_tasks_are_in_vertex_and_subtask_order() -> None:
    tasks = {"2:10": MAP, "2:9": MAP, "10:0": SOURCE, "1:0": SOURCE}
    span = checkpoint_span(summary(), tasks, job_id="j", attempt=0, wall_offset_s=0.0)
    assert span is not None and [c.attributes["sluice.task"] for c in span.children] == ["1:0", "2:9", "2:10", "10:0"]


def test_a_recovery_is_one_span_from_the_failure_to_running_again() -> None:
    assert recovery_span(job_id="j", attempt=3, seconds=1.5, running_at_s=1200.0, cause="task 2:0 failed: boom",
                         restored_checkpoint_id=6) == SpanRecord(
        "recovery", 1198.5, 1200.0, {"sluice.job.id": "j", "sluice.job.attempt": 3,
                                     "sluice.recovery.cause": "task 2:0 failed: boom",
                                     "sluice.recovery.restored_checkpoint_id": 6})
    fresh = recovery_span(job_id="j", attempt=1, seconds=0.25, running_at_s=10.0, cause="",
                          restored_checkpoint_id=None)
    assert "sluice.recovery.restored_checkpoint_id" not in fresh.attributes


def test_the_checkpoint_coordinator_hands_out_a_checkpoint_only_once_it_has_ended() -> None:
    coordinator = CheckpointCoordinator(CheckpointSettings(None), frozenset({"1:0"}), now=0.0)
    checkpoint_id, _ = coordinator.request(10.0)
    assert coordinator.ended(checkpoint_id) is None  # in flight
    coordinator.ack(11.5, checkpoint_id, "1:0", {}, SOURCE)
    assert coordinator.ended(checkpoint_id) is None  # its _metadata is being written
    coordinator.metadata_written(12.0, checkpoint_id)
    ended = coordinator.ended(checkpoint_id)
    assert ended is not None
    done, tasks = ended
    assert (done.status, done.started_at, done.duration_s, tasks) == (Status.COMPLETED, 10.0, 1.5, {"1:0": SOURCE})
    assert coordinator.ended(checkpoint_id + 1) is None


def test_prometheus_families_become_otlp_sums_and_gauges() -> None:
    completed = CounterMetricFamily("sluice_checkpoints_completed", "Checkpoints completed", labels=["job_id"])
    completed.add_metric(["j"], 3)
    workers = GaugeMetricFamily("sluice_workers_registered", "Workers registered")
    workers.add_metric([], 2)
    durations = HistogramMetricFamily("sluice_checkpoint_duration_seconds", "Durations",
                                      buckets=[("1.0", 2), ("+Inf", 3)], sum_value=4.5)
    assert otlp_series([completed, workers, durations]) == {
        "sluice_checkpoints_completed": Series(COUNTER, "Checkpoints completed", ((3.0, {"job_id": "j"}),)),
        "sluice_workers_registered": Series(GAUGE, "Workers registered", ((2.0, {}),)),
        "sluice_checkpoint_duration_seconds_count": Series(COUNTER, "Durations (count)", ((3.0, {}),)),
        "sluice_checkpoint_duration_seconds_sum": Series(COUNTER, "Durations (sum)", ((4.5, {}),)),
    }


def test_the_otlp_endpoint_comes_from_the_flag_or_the_standard_variable_and_is_off_without_either() -> None:
    assert OtlpSettings.from_flags(None, 10.0, environ={}) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert OtlpSettings.from_flags(None, 2.0, environ=env) == OtlpSettings("http://collector:4318/", 2.0)
    flagged = OtlpSettings.from_flags("https://c:4318", 10.0, environ=env)
    assert flagged is not None and flagged.url("traces") == "https://c:4318/v1/traces"
    with pytest.raises(ValueError, match="http:// or https:// URL"):
        OtlpSettings.from_flags("collector:4318", 10.0, environ={})


def test_spans_reach_a_collector_with_their_times_and_parents() -> None:
    record = SpanRecord("checkpoint", 1700000000.25, 1700000001.5, {"sluice.checkpoint.id": 4},
                        (SpanRecord("checkpoint.task", 1700000000.5, 1700000001.0, {"sluice.task": "1:0"}),),
                        error="")
    failed = SpanRecord("checkpoint", 1700000002.0, 1700000003.0, {"sluice.checkpoint.id": 5}, error="declined")
    with otlp_receiver() as receiver:
        telemetry = Telemetry(OtlpSettings(receiver.endpoint), collectors=(), instance_id="c-1")
        telemetry.submit(lambda: record)  # built and made on the telemetry's thread, as the coordinator does

        def broken() -> SpanRecord:
            raise ZeroDivisionError("a trace that fails to build")

        telemetry.submit(broken)  # logged; the next one goes out all the same
        telemetry.submit(lambda: None)  # a checkpoint still in progress: nothing
        telemetry.emit(failed)
        asyncio.run(telemetry.shutdown())  # builds and sends what is queued
        spans = {(s.name, s.attributes.get("sluice.checkpoint.id")): s for s in receiver.spans()}
    root, task, other = spans[("checkpoint", 4)], spans[("checkpoint.task", None)], spans[("checkpoint", 5)]
    assert (root.start_ns, root.end_ns, root.parent_span_id) == (1700000000250000000, 1700000001500000000, "")
    assert (task.start_ns, task.end_ns) == (1700000000500000000, 1700000001000000000)
    assert task.parent_span_id == root.span_id and task.trace_id == root.trace_id != other.trace_id
    assert (other.status_code, other.status_message) == (2, "declined")
    assert root.resource["service.name"] == "sluice-coordinator" and root.resource["service.instance.id"] == "c-1"
    assert len(spans) == 3 and receiver.bad_requests == [] and telemetry.dropped == 0


def test_a_collector_that_is_down_is_one_line_now_and_then_not_three_a_second(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    failures = ExportFailures("http://collector:4318", lambda: clock[0])

    def sdk(level: int, message: str) -> bool:
        record = logging.LogRecord("opentelemetry.exporter.otlp.proto.http.trace_exporter", level, "x", 1, message,
                                   None, None)
        return failures.filter(record)

    refused = "Transient error ConnectionRefused encountered while exporting spans batch, retrying in 0.8s."
    with caplog.at_level(logging.WARNING, logger="sluice.telemetry"):
        assert sdk(logging.WARNING, refused) is False  # the SDK's own line is dropped
        clock[0] += 1.0
        assert [sdk(logging.WARNING, refused), sdk(logging.ERROR, "Failed to export spans batch")] == [False, False]
        clock[0] += FAILURE_REPEAT_S
        sdk(logging.ERROR, "Failed to export spans batch due to timeout")
        assert sdk(logging.INFO, "an info line passes") is True
    assert [r.getMessage() for r in caplog.records] == [
        "OTLP export to http://collector:4318 failing (1 failed attempts since last said): Transient error "
        "ConnectionRefused; what it could not send is dropped",
        "OTLP export to http://collector:4318 failing (3 failed attempts since last said): Failed to export spans "
        "batch due to timeout; what it could not send is dropped"]
