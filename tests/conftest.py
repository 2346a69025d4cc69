"""The shared fixtures of the integration and chaos tiers: the cluster (tests/support/cluster.py has the
harness), one Spark session for every test that uses Spark in-process and one Spark Connect server for the
`sluice data` commands the tests run against it; and how the tiers split over
pytest-xdist's processes (scripts/test.sh runs them with `-n 2 --dist loadgroup`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support.cluster import Cluster, reaped_cluster
from tests.support.spark_connect import SparkConnectServer, connect_skip_reason

# Property tests assert invariants, not speed: on two busy cores one example can take longer than Hypothesis's
# default 200 ms deadline, and generating data can trip its too_slow health check (a unit run beside the
# integration tier failed a pure property test that way). A test may still set its own settings.
settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")

# The groups that take longest, started first so that the two xdist processes finish together (the longest
# first: the last groups are the short ones); every other file follows in collection order. By the sums of a
# run's --durations (spark 370 s of ~1,050 s per process, under load; test_interval_join.py is ~20 s now).
HEAVY_FIRST = ("spark", "test_async_state.py", "test_failover.py", "test_state_backends.py", "test_install.py",
               "test_remote_state_backend.py", "test_lake.py", "test_coordinator_failover.py", "test_job_end.py",
               "test_quickstart.py", "test_rescale_restore.py", "test_rescale_running.py", "test_checkpoints.py")


def xdist_group_of(item: pytest.Item) -> str:
    """A file's tests run in one process (its module-scoped servers and clusters start once); every test
    that uses Spark runs in one process too (one JVM each for the session and the Connect server, started once)."""
    fixtures = getattr(item, "fixturenames", ())
    return "spark" if "spark" in fixtures or "spark_connect" in fixtures else item.path.name


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
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One local Spark session for the whole run (its JVM start is paid once); skips without PySpark or Java.
    When the run has tests of the Spark Connect server too, that server's JVM starts beside this one."""
    pytest.importorskip("pyspark")
    from runtime.data.spark import find_java, start_session, stop_session

    if find_java() is None:
        pytest.skip("no Java: Spark needs Java 17")
    if any("spark_connect" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("spark_connect_launched")
    session = start_session("local[2]", "sluice-tests", shuffle_partitions=2)
    yield session
    stop_session(session)


@pytest.fixture(scope="session")
def spark_connect_launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer | str]:
    """The run's Spark Connect server, launched and not waited for (tests/support/spark_connect.py); or why it
    cannot run here. Stopped by PID after the run's last test."""
    reason = connect_skip_reason()
    if reason is not None:
        yield reason
        return
    server = SparkConnectServer(tmp_path_factory.mktemp("spark-connect"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_connect(spark_connect_launched: SparkConnectServer | str) -> SparkConnectServer:
    """One Spark Connect server for the whole run, ready (its JVM start is paid once; `server.url` is the
    `--master`); skips without Java or the Connect client (the `spark-connect` extra)."""
    if isinstance(spark_connect_launched, str):
        pytest.skip(spark_connect_launched)
    return spark_connect_launched.wait_ready()
