"""Prometheus metrics of the coordinator, read at scrape time.

The collector sees only frozen snapshots: the worker registry's and the job
manager's `statistics()` (each job's carries its checkpoint coordinator's), so
a scrape never reads a record while the event loop changes it, and the
collector is tested with plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from netstack.metrics_http import protocol_failures
from runtime.graph.checkpoint_figures import AGGREGATED
from runtime.graph.enums import JobState

if TYPE_CHECKING:
    from coordinator.autoscale import ScalingStatistics
    from coordinator.jobs import JobStatistics
    from coordinator.load_scaler import LoadScalingStatistics
    from coordinator.registry import RegistryStatistics


# Per-job series are labelled job_id, not job: Prometheus sets `job` to the scrape job and renames ours to
# exported_job.
JOB_LABEL = ["job_id"]

DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class HistogramStatistics:
    buckets: tuple[float, ...]  # upper bounds; one more count for +Inf
    counts: tuple[int, ...]  # per bucket, not cumulative
    sum: float

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cumulative = []
        running = 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=self.sum)


class DurationHistogram:
    """Checkpoint durations, bucketed as Prometheus expects (cumulative at scrape time)."""

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def statistics(self) -> HistogramStatistics:
        return HistogramStatistics(self.buckets, tuple(self.counts), self.sum)


@dataclass(frozen=True)
class JobsStatistics:
    """Every job the coordinator knows, plus the duration histograms over all of them."""

    jobs: tuple[JobStatistics, ...]
    checkpoint_durations: HistogramStatistics
    restart_durations: HistogramStatistics
    scaling: tuple[ScalingStatistics, ...] = ()  # jobs that were ever restarted or rescaled
    load_scaling: tuple[LoadScalingStatistics, ...] = ()  # jobs whose load autoscaler ran


class CoordinatorCollector(Collector):
    def __init__(self, *, workers: Callable[[], RegistryStatistics], jobs: Callable[[], JobsStatistics]) -> None:
        self._workers = workers
        self._jobs = jobs

    def collect(self) -> Iterator[Metric]:
        ws, js = self._workers(), self._jobs()
        workers = GaugeMetricFamily("sluice_workers_registered", "Workers registered with the coordinator")
        workers.add_metric([], ws.registered)
        slots = GaugeMetricFamily("sluice_slots_total", "Task slots offered by registered workers")
        slots.add_metric([], ws.slots_total)
        running = GaugeMetricFamily("sluice_jobs_running", "Jobs in state RUNNING")
        running.add_metric([], sum(1 for j in js.jobs if j.state in (JobState.RUNNING, JobState.FINISHING)))
        by_state = GaugeMetricFamily("sluice_jobs", "Jobs known to the coordinator, by state", labels=["state"])
        counts: dict[str, int] = {}
        for j in js.jobs:
            counts[j.state] = counts.get(j.state, 0) + 1
        for state, n in sorted(counts.items()):
            by_state.add_metric([state], n)
        yield from (workers, slots, running, by_state, protocol_failures())
        yield from self._checkpoints(js)
        yield from self._scaling(js)

    def _scaling(self, js: JobsStatistics) -> Iterator[Metric]:
        job = JOB_LABEL
        downs = CounterMetricFamily("sluice_job_scale_downs", "Restarts at a lower parallelism than the one "
                                    "asked for, because too few slots were free", labels=job)
        ups = CounterMetricFamily("sluice_job_scale_ups", "Rescales of a scaled-down job back up, because workers "
                                  "registered again", labels=job)
        below = GaugeMetricFamily("sluice_job_scaled_down", "1 while the job runs below the parallelism asked for",
                                  labels=job)
        for s in js.scaling:
            downs.add_metric([s.job_id], s.scale_downs)
            ups.add_metric([s.job_id], s.scale_ups)
            below.add_metric([s.job_id], int(s.scaled_down))
        yield from (downs, ups, below)
        decisions = CounterMetricFamily("sluice_autoscaler_decisions", "Decisions of the load autoscaler, applied "
                                        "or dry-run, by vertex and direction", labels=[*job, "vertex", "direction"])
        recommended = GaugeMetricFamily("sluice_autoscaler_recommended_parallelism", "The parallelism the load "
                                        "autoscaler's last evaluation recommends for each vertex",
                                        labels=[*job, "vertex"])
        for ls in js.load_scaling:
            for vertex, direction, n in ls.decisions:
                decisions.add_metric([ls.job_id, vertex, direction], n)
            for vertex, parallelism in ls.recommended:
                recommended.add_metric([ls.job_id, vertex], parallelism)
        yield from (decisions, recommended)

    def _checkpoints(self, js: JobsStatistics) -> Iterator[Metric]:
        completed = CounterMetricFamily("sluice_checkpoints_completed", "Checkpoints completed (all jobs)")
        failed = CounterMetricFamily("sluice_checkpoints_failed", "Checkpoints aborted: timeout, decline, failure")
        in_progress = GaugeMetricFamily("sluice_checkpoints_in_progress", "Checkpoints currently in flight")
        job = JOB_LABEL
        last_duration = GaugeMetricFamily("sluice_checkpoint_last_duration_seconds",
                                          "Trigger to last acknowledgement of the last completed checkpoint",
                                          labels=job)
        # one gauge per aggregated checkpoint figure that names a metric (runtime/graph/checkpoint_figures.py)
        last_figures = {f.name: GaugeMetricFamily(f.metric, f.help, labels=job) for f in AGGREGATED if f.metric}
        n_done = n_failed = n_flight = 0
        for j in js.jobs:
            n_done += j.checkpoints_completed
            n_failed += j.checkpoints_failed
            st = j.checkpoint
            if st is None:
                continue
            n_flight += st.in_flight_id is not None and not j.terminal
            last = st.last_completed
            if last is not None:
                last_duration.add_metric([j.job_id], last.duration_s or 0.0)
                for name, gauge in last_figures.items():
                    gauge.add_metric([j.job_id], getattr(last.figures, name))
        completed.add_metric([], n_done)
        failed.add_metric([], n_failed)
        in_progress.add_metric([], n_flight)
        yield from (completed, failed, in_progress, last_duration, *last_figures.values())
        restarts = CounterMetricFamily("sluice_job_restarts", "Restarts after a failure", labels=job)
        restart_time = GaugeMetricFamily("sluice_job_last_restart_seconds",
                                         "Failure detected to running again, last restart", labels=job)
        restored = GaugeMetricFamily("sluice_job_last_restored_checkpoint_id",
                                     "Checkpoint the current attempt restored (absent: started from scratch)",
                                     labels=job)
        for j in js.jobs:
            restarts.add_metric([j.job_id], j.restarts)
            if j.last_restart_s is not None:
                restart_time.add_metric([j.job_id], j.last_restart_s)
            if j.restored_checkpoint_id is not None:
                restored.add_metric([j.job_id], j.restored_checkpoint_id)
        yield from (restarts, restart_time, restored)
        yield js.restart_durations.family("sluice_job_restart_duration_seconds",
                                                 "Failure detected to running again, all restarts")
        yield js.checkpoint_durations.family("sluice_checkpoint_duration_seconds",
                                             "Duration of completed checkpoints, trigger to last acknowledgement")


@dataclass(frozen=True)
class LeadershipStatistics:
    is_leader: bool
    epoch: int  # the lease epoch held (0: none)
    jobs_recovered: int  # unfinished jobs of a previous coordinator this one restarted
    record_writes: int
    record_write_failures: int


class LeadershipCollector(Collector):
    """Coordinator failover: whether this coordinator leads, and what it recovered (docs/METRICS.md)."""

    def __init__(self, statistics: Callable[[], LeadershipStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        st = self._statistics()
        leader = GaugeMetricFamily("sluice_coordinator_is_leader", "1 while this coordinator holds the lease")
        leader.add_metric([], 1 if st.is_leader else 0)
        epoch = GaugeMetricFamily("sluice_coordinator_lease_epoch", "The lease epoch held (0: standby)")
        epoch.add_metric([], st.epoch)
        recovered = CounterMetricFamily("sluice_coordinator_jobs_recovered",
                                        "Unfinished jobs of a previous coordinator restarted by this one")
        recovered.add_metric([], st.jobs_recovered)
        writes = CounterMetricFamily("sluice_coordinator_job_record_writes", "Job records written to the state dir")
        writes.add_metric([], st.record_writes)
        failures = CounterMetricFamily("sluice_coordinator_job_record_write_failures",
                                       "Job records that could not be written (the job went on)")
        failures.add_metric([], st.record_write_failures)
        yield from (leader, epoch, recovered, writes, failures)
