"""The trust policy: which job paths and savepoint directories a token holder may name."""

from __future__ import annotations

import pytest

from coordinator.trust import TrustError, TrustPolicy, is_within

POLICY = TrustPolicy(job_paths=("/srv/jobs", "/home/ann/work"), savepoint_roots=("/data/savepoints", "/backup"))


@pytest.mark.parametrize(("path", "root", "inside"), [
    ("/srv/jobs", "/srv/jobs", True),
    ("/srv/jobs/team/a", "/srv/jobs", True),
    ("/srv/jobs/", "/srv/jobs", True),
    ("/srv/jobsX", "/srv/jobs", False),  # a common string prefix is not a parent directory
    ("/srv", "/srv/jobs", False),
    ("/srv/jobs/../etc", "/srv/jobs", False),  # normalized before comparing
    ("/", "/srv/jobs", False),
    ("/anything", "/", True),
])
def test_is_within(path: str, root: str, inside: bool) -> None:
    assert is_within(path, root) is inside


def test_job_path_under_a_root_is_allowed() -> None:
    assert POLICY.check_job_path("/srv/jobs/team") == "/srv/jobs/team"
    assert POLICY.check_job_path("/home/ann/work") == "/home/ann/work"
    assert POLICY.check_job_path("") == ""  # no path of the client's: only what the coordinator has


def test_job_path_outside_every_root_is_refused_naming_path_and_option() -> None:
    with pytest.raises(TrustError) as err:
        POLICY.check_job_path("/tmp/evil")
    assert "/tmp/evil" in str(err.value) and "--allowed-job-path" in str(err.value)
    with pytest.raises(TrustError, match="--allowed-job-path"):
        POLICY.check_job_path("/srv/jobs/../../tmp")
    with pytest.raises(TrustError, match="not absolute"):
        POLICY.check_job_path("relative/dir")


def test_savepoint_directory() -> None:
    assert POLICY.check_savepoint_dir(None) == "/data/savepoints"  # the first root is the default
    assert POLICY.check_savepoint_dir("") == "/data/savepoints"
    assert POLICY.check_savepoint_dir("/backup/nightly") == "/backup/nightly"
    with pytest.raises(TrustError) as err:
        POLICY.check_savepoint_dir("/etc/cron.d")
    assert "/etc/cron.d" in str(err.value) and "--savepoint-root" in str(err.value)
    with pytest.raises(TrustError, match="not absolute"):
        POLICY.check_savepoint_dir("savepoints")


def test_policy_needs_absolute_roots_and_a_savepoint_root() -> None:
    with pytest.raises(ValueError, match="absolute"):
        TrustPolicy(job_paths=("jobs",), savepoint_roots=("/sp",))
    with pytest.raises(ValueError, match="savepoint root"):
        TrustPolicy(job_paths=("/jobs",), savepoint_roots=())
    assert TrustPolicy(job_paths=(), savepoint_roots=("/sp",)).check_job_path("") == ""
