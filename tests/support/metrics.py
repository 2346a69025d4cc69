"""A coordinator metrics collector over fixed statistics, and the samples one scrape of it yields."""

from __future__ import annotations

from coordinator.metrics import CoordinatorCollector, JobsStatistics
from coordinator.registry import RegistryStatistics


def samples(collector: CoordinatorCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in collector.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def collector(workers: RegistryStatistics, jobs: JobsStatistics) -> CoordinatorCollector:
    return CoordinatorCollector(workers=lambda: workers, jobs=lambda: jobs)


NO_WORKERS = RegistryStatistics(())
