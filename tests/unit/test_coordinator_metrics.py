"""CoordinatorCollector over statistics snapshots only: the exact samples each scrape yields."""

from __future__ import annotations

from coordinator.checkpointing import CheckpointStatistics, CheckpointSummary, Status
from coordinator.jobs import JobRecord, JobStatistics
from coordinator.metrics import DurationHistogram, HistogramStatistics, JobsStatistics
from coordinator.registry import RegistryStatistics, WorkerStatistics
from runtime.graph.enums import JobState
from tests.support.metrics import NO_WORKERS, collector, samples


def empty_histogram() -> HistogramStatistics:
    return DurationHistogram().statistics()


def job(job_id: str, state: str = JobState.RUNNING, *, checkpoint: CheckpointStatistics | None = None,
        completed: int = 0, failed: int = 0, restarts: int = 0, last_restart_s: float | None = None,
        restored: int | None = None) -> JobStatistics:
    terminal = state in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)
    return JobStatistics(job_id, state, terminal, completed, failed, checkpoint, restarts, last_restart_s, restored)


def test_workers_slots_and_jobs_by_state():
    ws = RegistryStatistics((WorkerStatistics("w1", 2, 0.1), WorkerStatistics("w2", 3, 0.2)))
    js = JobsStatistics((job("a"), job("b", JobState.FINISHING), job("c", JobState.FAILED), job("d")),
                        empty_histogram(), empty_histogram())
    got = samples(collector(ws, js))
    assert got[("sluice_workers_registered", ())] == 2
    assert got[("sluice_slots_total", ())] == 5
    assert got[("sluice_jobs_running", ())] == 3  # RUNNING and FINISHING
    assert got[("sluice_jobs", (("state", "RUNNING"),))] == 2
    assert got[("sluice_jobs", (("state", "FINISHING"),))] == 1
    assert got[("sluice_jobs", (("state", "FAILED"),))] == 1


def test_no_workers_no_jobs_still_yields_every_family_with_zeros():
    got = samples(collector(NO_WORKERS, JobsStatistics((), empty_histogram(), empty_histogram())))
    assert got[("sluice_workers_registered", ())] == 0
    assert got[("sluice_slots_total", ())] == 0
    assert got[("sluice_jobs_running", ())] == 0
    assert got[("sluice_checkpoints_completed_total", ())] == 0
    assert got[("sluice_checkpoints_in_progress", ())] == 0
    assert got[("sluice_checkpoint_duration_seconds_count", ())] == 0


def test_checkpoint_figures_of_the_last_completed_checkpoint_and_counts_over_jobs():
    last = CheckpointSummary(7, Status.COMPLETED, "unaligned", False, 100.0, 1.5, state_bytes=2048,
                             inflight_bytes=512, alignment_s=0.0, start_delay_s=0.25)
    running = CheckpointStatistics(completed=7, failed=1, consecutive_failures=0, in_flight_id=8, queued=0,
                                   last_completed_id=7, last_completed=last)
    js = JobsStatistics((job("a", checkpoint=running, completed=9, failed=2),
                         job("b", JobState.CANCELLED, checkpoint=CheckpointStatistics(1, 0, 0, 2, 0, None, None),
                             completed=1),
                         job("c", JobState.CREATED, completed=3, failed=1)),
                        empty_histogram(), empty_histogram())
    got = samples(collector(NO_WORKERS, js))
    assert got[("sluice_checkpoints_completed_total", ())] == 13
    assert got[("sluice_checkpoints_failed_total", ())] == 3
    assert got[("sluice_checkpoints_in_progress", ())] == 1  # b's in-flight one does not count: b has ended
    assert got[("sluice_checkpoint_last_duration_seconds", (("job_id", "a"),))] == 1.5
    assert got[("sluice_checkpoint_last_persisted_inflight_bytes", (("job_id", "a"),))] == 512
    assert got[("sluice_checkpoint_last_state_bytes", (("job_id", "a"),))] == 2048
    assert got[("sluice_checkpoint_last_alignment_seconds", (("job_id", "a"),))] == 0.0
    assert got[("sluice_checkpoint_last_start_delay_seconds", (("job_id", "a"),))] == 0.25
    assert ("sluice_checkpoint_last_duration_seconds", (("job_id", "b"),)) not in got


def test_restart_figures_and_duration_histograms():
    checkpoints, restarts = DurationHistogram(), DurationHistogram()
    for v in (0.04, 0.3, 200.0):
        checkpoints.observe(v)
    restarts.observe(2.0)
    js = JobsStatistics((job("a", restarts=2, last_restart_s=2.0, restored=5), job("b")),
                        checkpoints.statistics(), restarts.statistics())
    got = samples(collector(NO_WORKERS, js))
    assert got[("sluice_job_restarts_total", (("job_id", "a"),))] == 2
    assert got[("sluice_job_restarts_total", (("job_id", "b"),))] == 0
    assert got[("sluice_job_last_restart_seconds", (("job_id", "a"),))] == 2.0
    assert ("sluice_job_last_restart_seconds", (("job_id", "b"),)) not in got
    assert got[("sluice_job_last_restored_checkpoint_id", (("job_id", "a"),))] == 5
    assert got[("sluice_checkpoint_duration_seconds_bucket", (("le", "0.05"),))] == 1
    assert got[("sluice_checkpoint_duration_seconds_bucket", (("le", "0.5"),))] == 2
    assert got[("sluice_checkpoint_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("sluice_checkpoint_duration_seconds_count", ())] == 3
    assert got[("sluice_checkpoint_duration_seconds_sum", ())] == 200.34
    assert got[("sluice_job_restart_duration_seconds_bucket", (("le", "2.0"),))] == 1


def test_histogram_statistics_are_a_snapshot():
    h = DurationHistogram()
    h.observe(1.0)
    st = h.statistics()
    h.observe(1.0)
    assert sum(st.counts) == 1 and sum(h.statistics().counts) == 2


def test_job_record_statistics_without_a_running_checkpoint_coordinator():
    rec = JobRecord("job-1", "mod:build", "mod", "", {})
    rec.restarts, rec.last_restart_s, rec.restored_checkpoint_id = 1, 0.5, 3
    rec.earlier_checkpoints = [{"status": "COMPLETED"}, {"status": "FAILED"}, {"status": "COMPLETED"}]
    assert rec.statistics() == JobStatistics("job-1", JobState.CREATED, False, 2, 1, None, 1, 0.5, 3)
