"""A slow file sink a test can speed up: `ReleasableSink` (job-module source to paste into a test's job) keeps
its job backpressured until the test calls `release`, then writes at full speed."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import Cluster

# Slow, so the job stays backpressured (data in flight for a rescale's unaligned checkpoint, aligned barriers
# queued behind data) until the test has checked all it checks while the job runs; then the test creates the file
# RELEASE (`release`) and the sink writes at full speed, so the rest of the input drains in a moment instead of
# at the slow rate (tens of seconds of the suite per test). Paste it into a job module that defines RELEASE and
# imports FileSink; it has no braces, so it can go into a str.format template.
RELEASABLE_SINK = """
import os


class ReleasableSink(FileSink):
    def throttle(self):
        self._throttled = getattr(self, "_throttled", 0) + 1
        if self._throttled % 512 == 0 and self.delay_per_record_s and os.path.exists(RELEASE):
            self.delay_per_record_s = 0.0
        super().throttle()


ReleasableSink.__name__ = "FileSink"  # the vertex names the tests read stay "Count -> FileSink"
"""


def release_path(cluster: Cluster) -> str:
    """The file whose existence lets a job's ReleasableSink write at full speed."""
    return str(cluster.tmp_path / "release")


def release(cluster: Cluster) -> None:
    """Let the job's ReleasableSink write at full speed (within its next 512 records)."""
    Path(release_path(cluster)).touch()
