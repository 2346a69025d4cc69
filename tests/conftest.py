"""The shared fixtures of the integration and chaos tiers: the cluster (tests/support/cluster.py has the
harness) and one Spark session for every test that uses Spark in-process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, reaped_cluster


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
    session = start_session("local[2]", "sluice-tests")
    yield session
    stop_session(session)
