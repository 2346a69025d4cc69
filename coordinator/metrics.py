"""Prometheus metrics of the coordinator, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.metrics import protocol_failures

if TYPE_CHECKING:
    from coordinator.server import Coordinator


class CoordinatorCollector(Collector):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def collect(self) -> Iterator[Metric]:
        c = self.coordinator
        workers = GaugeMetricFamily("sluice_workers_registered", "Workers registered with the coordinator")
        workers.add_metric([], len(c.workers))
        slots = GaugeMetricFamily("sluice_slots_total", "Task slots offered by registered workers")
        slots.add_metric([], sum(w.slots for w in c.workers.values()))
        running = GaugeMetricFamily("sluice_jobs_running", "Jobs in state RUNNING")
        running.add_metric([], sum(1 for j in c.jobs.values() if j.state == "RUNNING"))
        by_state = GaugeMetricFamily("sluice_jobs", "Jobs known to the coordinator, by state", labels=["state"])
        counts: dict[str, int] = {}
        for j in c.jobs.values():
            counts[j.state] = counts.get(j.state, 0) + 1
        for state, n in sorted(counts.items()):
            by_state.add_metric([state], n)
        yield from (workers, slots, running, by_state, protocol_failures())
