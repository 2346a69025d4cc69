"""The one cluster fixture of the integration and chaos tiers (tests/support/cluster.py has the harness)."""

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
