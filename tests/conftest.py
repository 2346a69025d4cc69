"""The shared fixtures of the integration and chaos tiers: the cluster (tests/support/cluster.py has the
harness) and one Spark session for every test that uses Spark in-process; and how the tiers split over
pytest-xdist's processes (scripts/test.sh runs them with `-n 2 --dist loadgroup`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, reaped_cluster

# The groups that take longest, started first so that the two xdist processes finish together (the longest
# first: the last groups are the short ones); every other file follows in collection order. By the sums of a
# run's --durations (spark 370 s of ~1,050 s per process, under load; test_interval_join.py is ~20 s now).
HEAVY_FIRST = ("spark", "test_async_state.py", "test_failover.py", "test_state_backends.py", "test_install.py",
               "test_remote_state_backend.py", "test_lake.py", "test_coordinator_failover.py", "test_job_end.py",
               "test_quickstart.py", "test_rescale_restore.py", "test_rescale_running.py", "test_checkpoints.py")


def xdist_group_of(item: pytest.Item) -> str:
    """A file's tests run in one process (its module-scoped servers and clusters start once); every test
    that uses Spark runs in one process too (one JVM, started once)."""
    return "spark" if "spark" in getattr(item, "fixturenames", ()) else item.path.name


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
    items.sort(key=lambda item: rank.get(xdist_group_of(item), len(rank)))  # stable: file order kept


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[Cluster]:
    """A cluster with nothing started yet (`cluster.start(...)` or the start_* methods), reaped afterwards."""
    with reaped_cluster(tmp_path) as c:
        yield c


@pytest.fixture
def running_cluster(cluster: Cluster) -> Cluster:
    """A coordinator and two workers with two slots each, registered."""
    return cluster.start(2)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole run (its JVM start-up is paid once); skips without PySpark or Java."""
    pytest.importorskip("pyspark")
    from runtime.data.spark import find_java, start_session, stop_session

    if find_java() is None:
        pytest.skip("no Java: Spark needs Java 17")
    session = start_session("local[2]", "sluice-tests", shuffle_partitions=2)
    yield session
    stop_session(session)
