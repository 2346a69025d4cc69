"""One work directory for the chaos tests of a session: they run one after another and share the same
Spark-generated input (same rows, keys, data seed and partitions), so Spark generates it once; each run
clears its own output, state and logs first (runtime/cli/chaos.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def chaos_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("java") is None:
        pytest.fail("the chaos tests need Java 17 for Spark (apt-get install openjdk-17-jre-headless)")
    return tmp_path_factory.mktemp("chaos")
