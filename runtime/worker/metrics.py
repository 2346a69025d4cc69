"""Prometheus metrics of a worker, read from the live objects at scrape time.

Tasks and links keep plain counters on the hot path; this collector turns
them into metric families only when Prometheus scrapes, so metrics cost
nothing per record. Every name starts with `sluice_` (see docs/METRICS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from netstack.metrics_http import link_timeouts, protocol_failures
from runtime.execution.async_io import LATENCY_BUCKETS_S, AsyncIOOperator
from runtime.graph.enums import TaskState
from runtime.worker.connector_metrics import FAMILIES, GAUGE, Figure, task_figures

if TYPE_CHECKING:
    from runtime.worker.worker import Worker


class WorkerCollector(Collector):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        labels = ["job_id", "task", "subtask"]  # not "job": Prometheus renames that to exported_job
        rin = CounterMetricFamily("sluice_task_records_in", "Records a task consumed (not watermarks)", labels=labels)
        wm_in = CounterMetricFamily("sluice_task_watermarks_in", "Watermark and idle/active status markers a task "
                                    "received (jobs with event time)", labels=labels)
        rout = CounterMetricFamily("sluice_task_records_out", "Records a task emitted (or wrote, for sinks)",
                                   labels=labels)
        busy = CounterMetricFamily("sluice_task_busy_seconds", "Time a task spent processing", labels=labels)
        idle = CounterMetricFamily("sluice_task_idle_seconds", "Time a task waited for input", labels=labels)
        bp = CounterMetricFamily("sluice_task_backpressured_seconds",
                                 "Time a task waited for an output buffer", labels=labels)
        bin_ = CounterMetricFamily("sluice_task_bytes_in", "Bytes of buffers a task received", labels=labels)
        bout = CounterMetricFamily("sluice_task_bytes_out", "Bytes of buffers a task produced", labels=labels)
        inq = GaugeMetricFamily("sluice_task_input_queue_buffers", "Buffers received and not yet processed",
                                labels=labels)
        outq = GaugeMetricFamily("sluice_task_output_queue_buffers", "Buffers waiting for credit or the socket",
                                 labels=labels)
        pool = GaugeMetricFamily("sluice_task_output_pool_usage_ratio",
                                 "Queued buffers over the limit of the task's fullest output channel (the one "
                                 "that blocks it); 1 means backpressured", labels=labels)
        align = GaugeMetricFamily("sluice_task_checkpoint_alignment_seconds",
                                  "First barrier to last barrier in the task's last checkpoint", labels=labels)
        delay = GaugeMetricFamily("sluice_task_checkpoint_start_delay_seconds",
                                  "Checkpoint trigger to the task's first barrier, last checkpoint", labels=labels)
        persisted = GaugeMetricFamily("sluice_task_checkpoint_last_persisted_inflight_bytes",
                                      "In-flight data the task persisted in its last checkpoint", labels=labels)
        persisted_total = CounterMetricFamily("sluice_task_checkpoint_persisted_inflight_bytes",
                                              "In-flight data the task persisted over all checkpoints",
                                              labels=labels)
        switched = CounterMetricFamily("sluice_task_checkpoint_channels_switched",
                                       "Channels an aligned checkpoint switched to unaligned at the task (input and "
                                       "output side; checkpoint.channel_timeout_s / channel_inflight_bytes)",
                                       labels=labels)
        refused = CounterMetricFamily("sluice_task_checkpoint_switches_refused",
                                      "Channel switches the task's in-flight cap (checkpoint.max_inflight_bytes) "
                                      "refused: the channel stayed aligned", labels=labels)
        watermark = GaugeMetricFamily("sluice_task_current_watermark",
                                      "The task's event-time watermark in ms (jobs with event time only; "
                                      "-2^63 before the first one)", labels=labels)
        async_in_flight = GaugeMetricFamily("sluice_task_async_state_in_flight_records",
                                            "Records an asynchronous keyed operator has admitted and not finished "
                                            "(tasks with an AsyncKeyedProcessFunction only)", labels=labels)
        async_blocked = CounterMetricFamily("sluice_task_async_state_blocked_seconds",
                                            "Time a task's input waited because its asynchronous keyed operator "
                                            "had max_in_flight records in flight", labels=labels)
        async_captured = CounterMetricFamily("sluice_task_async_state_captured_records",
                                             "Records in flight that capture-mode checkpoints stored for replay",
                                             labels=labels)
        isolated = GaugeMetricFamily("sluice_task_isolated",
                                     "1 while the task runs its operators on a thread of its own (blocking user "
                                     "code, runtime/execution/isolation.py), 0 while on the worker's event loop",
                                     labels=labels)
        slow = CounterMetricFamily("sluice_task_slow_user_calls",
                                   "User calls of the task found running past the worker's --slow-call threshold "
                                   "(each reported once, with its stack, in the log and the job's exception history)",
                                   labels=labels)
        io = _AsyncIOFamilies(labels)
        connectors = _ConnectorFamilies(labels)
        for job_id, task in self.worker.all_tasks():
            st = task.statistics()
            values = [job_id, task.key.operator, str(task.key.subtask)]
            op = task.chain.async_operator
            if isinstance(op, AsyncIOOperator):  # async_map: its own families, not the async state ones
                io.add(values, op)
                st.async_in_flight = None
            connectors.add(values, task_figures(getattr(task, "source", None), task.chain.sinks))
            isolated.add_metric(values, 1.0 if task.isolation.isolated or task.isolation.user_loop else 0.0)
            slow.add_metric(values, st.slow_user_calls)
            rin.add_metric(values, st.records_in)
            wm_in.add_metric(values, st.watermarks_in)
            rout.add_metric(values, st.records_out)
            busy.add_metric(values, st.busy_s)
            idle.add_metric(values, st.idle_s)
            bp.add_metric(values, st.backpressured_s)
            bin_.add_metric(values, st.bytes_in)
            bout.add_metric(values, st.bytes_out)
            inq.add_metric(values, st.input_queue)
            outq.add_metric(values, st.output_queue)
            pool.add_metric(values, st.output_pool_usage)
            align.add_metric(values, st.last_alignment_s)
            delay.add_metric(values, st.last_start_delay_s)
            persisted.add_metric(values, st.last_inflight_bytes)
            persisted_total.add_metric(values, st.inflight_bytes_total)
            switched.add_metric(values, st.channels_switched)
            refused.add_metric(values, st.switches_refused)
            if st.current_watermark is not None:
                watermark.add_metric(values, st.current_watermark)
            if st.async_in_flight is not None:
                async_in_flight.add_metric(values, st.async_in_flight)
                async_blocked.add_metric(values, st.async_blocked_s)
                async_captured.add_metric(values, st.async_captured_records)
        yield from (rin, wm_in, rout, busy, idle, bp, bin_, bout, inq, outq, pool, align, delay, persisted,
                    persisted_total, switched, refused, watermark, async_in_flight, async_blocked, async_captured,
                    isolated, slow)
        yield from io.families()
        yield from connectors.families()

        peer = ["peer"]
        sent_b = CounterMetricFamily("sluice_connection_sent_bytes", "Bytes sent on a data connection", labels=peer)
        recv_b = CounterMetricFamily("sluice_connection_received_bytes", "Bytes received on a data connection",
                                     labels=peer)
        sent_f = CounterMetricFamily("sluice_connection_sent_frames", "Frames sent on a data connection",
                                     labels=peer)
        recv_f = CounterMetricFamily("sluice_connection_received_frames", "Frames received on a data connection",
                                     labels=peer)
        credit = GaugeMetricFamily("sluice_connection_credit",
                                   "Credits this worker holds to send to the peer (sum over channels)",
                                   labels=peer)
        net = self.worker.network
        credit_by_peer: dict[str, int] = {}
        for peer_id, sub in net.outbound_channels():
            credit_by_peer[peer_id] = credit_by_peer.get(peer_id, 0) + sub.sender.credit
        for peer_id, link in list(net.links.items()):
            sent_b.add_metric([peer_id], link.bytes_out)
            recv_b.add_metric([peer_id], link.bytes_in)
            sent_f.add_metric([peer_id], link.frames_out)
            recv_f.add_metric([peer_id], link.frames_in)
            credit.add_metric([peer_id], credit_by_peer.get(peer_id, 0))
        yield from (sent_b, recv_b, sent_f, recv_f, credit)

        slots = GaugeMetricFamily("sluice_worker_slots", "Task slots this worker offers")
        slots.add_metric([], self.worker.config.slots)
        running = GaugeMetricFamily("sluice_worker_tasks_running", "Tasks running on this worker")
        running.add_metric([], sum(1 for _, t in self.worker.all_tasks() if t.state == TaskState.RUNNING))
        yield from (slots, running, protocol_failures(), link_timeouts())


class _AsyncIOFamilies:
    """The metric families of async_map operators (docs/METRICS.md, Async I/O), one sample set per task."""

    def __init__(self, labels: list[str]) -> None:
        self.in_flight = GaugeMetricFamily("sluice_async_io_requests_in_flight",
                                           "Calls an async_map has started and not finished (at most its capacity)",
                                           labels=labels)
        self.completed = CounterMetricFamily("sluice_async_io_requests_completed",
                                             "Calls that succeeded (after their retries)", labels=labels)
        self.timed_out = CounterMetricFamily("sluice_async_io_requests_timed_out",
                                             "Call attempts that ran over timeout_s", labels=labels)
        self.retried = CounterMetricFamily("sluice_async_io_requests_retried",
                                           "Call attempts after the first (RetryPolicy)", labels=labels)
        self.failed = CounterMetricFamily("sluice_async_io_requests_failed",
                                          "Calls that failed for good; each fails the task", labels=labels)
        self.blocked = CounterMetricFamily("sluice_async_io_blocked_seconds",
                                           "Time the task's input waited because capacity calls were in flight",
                                           labels=labels)
        self.captured = CounterMetricFamily("sluice_async_io_captured_records",
                                            "Records not yet emitted that checkpoints stored, to call again after "
                                            "a restore", labels=labels)
        self.latency = HistogramMetricFamily("sluice_async_io_request_latency_seconds",
                                             "Time from a call's first attempt to its success, retries included",
                                             labels=labels)

    def add(self, values: list[str], op: AsyncIOOperator) -> None:
        stats = op.stats
        self.in_flight.add_metric(values, op.in_flight)
        self.completed.add_metric(values, stats.completed)
        self.timed_out.add_metric(values, stats.timed_out)
        self.retried.add_metric(values, stats.retried)
        self.failed.add_metric(values, stats.failed)
        self.blocked.add_metric(values, op.blocked_s)
        self.captured.add_metric(values, stats.captured)
        cumulative, buckets = 0, []
        for bound, n in zip([*map(str, LATENCY_BUCKETS_S), "+Inf"], stats.latency_buckets, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        self.latency.add_metric(values, buckets, stats.latency_sum_s)

    def families(self) -> list[Metric]:
        return [self.in_flight, self.completed, self.timed_out, self.retried, self.failed, self.blocked,
                self.captured, self.latency]


class _ConnectorFamilies:
    """Every connector's metric families (runtime/worker/connector_metrics.py's table), one sample set per task
    (and per topic/partition for a Kafka source's)."""

    def __init__(self, labels: list[str]) -> None:
        self.by_key: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            key: (GaugeMetricFamily if f.kind == GAUGE else CounterMetricFamily)(f.name, f.help,
                                                                                 labels=[*labels, *f.labels])
            for key, f in FAMILIES.items()}

    def add(self, values: list[str], figures: list[Figure]) -> None:
        for figure in figures:
            self.by_key[figure.family].add_metric([*values, *figure.labels], figure.value)

    def families(self) -> list[Metric]:
        return list(self.by_key.values())
