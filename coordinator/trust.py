"""What a token holder may make the coordinator touch on disk: the trust policy, pure.

The cluster token authenticates a client; it does not make the client's
paths safe. A submission names a directory the coordinator (and every
worker) puts on `sys.path` and imports the job module from, and a savepoint
request names a directory the cluster writes into. Both are checked here
against roots the operator chose on the coordinator's command line
(`--allowed-job-path`, `--savepoint-root`), so a stolen or shared token
cannot import arbitrary code or write files anywhere the processes can.

No I/O: callers pass absolute paths with symlinks already resolved
(`os.path.realpath`), so a link inside a root pointing out of it is judged
by where it leads. Restores only read msgpack/JSON and stay unrestricted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from runtime.common import objectstore


class TrustError(Exception):
    """A request named a path outside what the operator allowed."""


def is_within(path: str, root: str) -> bool:
    """`path` is `root` or below it (both absolute; compared component by component, not as strings).
    Object-store URLs (`s3://bucket/prefix`) are only ever within URL roots."""
    if objectstore.is_url(path) or objectstore.is_url(root):
        return objectstore.is_within(path, root)
    path, root = os.path.normpath(path), os.path.normpath(root)
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives, or one relative
        return False


@dataclass(frozen=True)
class TrustPolicy:
    """Roots as resolved, absolute paths."""

    job_paths: tuple[str, ...]
    savepoint_roots: tuple[str, ...]

    def __post_init__(self) -> None:
        for root in (*self.job_paths, *self.savepoint_roots):
            if not (os.path.isabs(root) or objectstore.is_url(root)):
                raise ValueError(f"trust roots must be absolute, got {root!r}")
        if not self.savepoint_roots:
            raise ValueError("at least one savepoint root is needed")

    @property
    def default_savepoint_root(self) -> str:
        return self.savepoint_roots[0]

    def check_job_path(self, path: str) -> str:
        """The job module directory if allowed; '' (the coordinator's own path) is always allowed."""
        if not path:
            return path
        if not os.path.isabs(path):
            raise TrustError(f"job path {path!r} is not absolute")
        if any(is_within(path, root) for root in self.job_paths):
            return os.path.normpath(path)
        allowed = ", ".join(self.job_paths) or "none"
        raise TrustError(f"job path {path} is not under an allowed job path ({allowed}); "
                         f"start the coordinator with --allowed-job-path {path} to allow it")

    def check_savepoint_dir(self, directory: str | None) -> str:
        """Where a savepoint may go: `directory` if under a root, the default root when None."""
        if directory is None or directory == "":
            return self.default_savepoint_root
        if not (os.path.isabs(directory) or objectstore.is_url(directory)):
            raise TrustError(f"savepoint directory {directory!r} is not absolute")
        if any(is_within(directory, root) for root in self.savepoint_roots):
            return objectstore.absolute(directory) if objectstore.is_url(directory) else os.path.normpath(directory)
        raise TrustError(f"savepoint directory {directory} is not under a savepoint root "
                         f"({', '.join(self.savepoint_roots)}); start the coordinator with "
                         f"--savepoint-root {directory} to allow it")
