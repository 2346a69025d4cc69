"""Bad command lines and busy ports get one clear line from a real `sluice` process, never a traceback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netstack.errors import RpcError
from runtime.cli.processes import Managed, child_env, stop_process
from tests.support.cluster import Cluster, write_module
from tests.support.cluster import sluice as client

pytestmark = pytest.mark.integration

EXIT_TIMEOUT_S = 30.0  # a process that should refuse at once; the old code kept running instead

ENDLESS_JOB = '''
from runtime.api import DiscardSink, GeneratorSource


def build(job):
    job.source(GeneratorSource(count=None, keys=10, records_per_second=200)).sink(DiscardSink())
'''


def sluice(*args: str, cwd: Path, env: dict[str, str] | None = None,
           python_prelude: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `sluice ARGS` to its end (killed after EXIT_TIMEOUT_S: a process that should have refused)."""
    if python_prelude is None:
        command = [sys.executable, "-m", "runtime.cli", *args]
    else:  # the same entry point after a line of setup in the same interpreter
        command = [sys.executable, "-c", f"{python_prelude}\nimport sys\nfrom runtime.cli.main import main\n"
                   "sys.exit(main(sys.argv[1:]))", *args]
    proc = subprocess.Popen(command, cwd=cwd, env=env or child_env("cli-errors-token", str(cwd)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_process(Managed("sluice", proc))
        out, err = proc.communicate()
        raise AssertionError(f"sluice {' '.join(args)} was still running after {EXIT_TIMEOUT_S}s; "
                             f"stdout {out!r} stderr {err!r}") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def assert_one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    error = lines[-1] if lines else ""
    for needle in needles:
        assert needle in error, (needle, proc.stderr)
    return error


# -- durations ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["coordinator", "--port", "0", "--heartbeat-timeout", "0s"],
    ["worker", "--coordinator", "127.0.0.1:1", "--heartbeat-interval", "0ms"],
    ["local", "nomodule:build", "--checkpoint-interval", "0"],
    ["local", "nomodule:build", "--restart-delay", "0m"],
])
def test_zero_duration_is_refused(tmp_path: Path, args: list[str]) -> None:
    proc = sluice(*args, "--state-dir" if args[0] == "coordinator" else "--slots",
                  str(tmp_path / "state") if args[0] == "coordinator" else "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc, args[-2], "more than zero")


# -- busy ports -----------------------------------------------------------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(("role", "flag"), [
    ("coordinator", "--port"), ("coordinator", "--metrics-port"),
    ("worker", "--data-port"), ("worker", "--metrics-port"),
])
def test_port_in_use_is_one_line_naming_it(tmp_path: Path, busy_port: int, role: str, flag: str) -> None:
    # the worker binds both ports before it looks for its coordinator, so none is needed here
    base = (["coordinator", "--port", "0", "--metrics-port", "0", "--state-dir", str(tmp_path / "state")]
            if role == "coordinator" else ["worker", "--coordinator", "127.0.0.1:1", "--data-port", "0",
                                           "--metrics-port", "0"])
    proc = sluice(*base, flag, str(busy_port), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert_one_line(proc, f"127.0.0.1:{busy_port}", flag, "already in use")


def test_local_with_a_busy_metrics_port_is_one_line_naming_it(tmp_path: Path, busy_port: int) -> None:
    write_module(tmp_path, "endless", ENDLESS_JOB)
    proc = sluice("local", "endless:build", "--workers", "1", "--metrics-port-base", str(busy_port), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    error = assert_one_line(proc, f"127.0.0.1:{busy_port}", "--metrics-port", "already in use")
    log = re.search(r"\(log: (\S+)\)", error)
    assert log and Path(log.group(1)).is_file(), error  # the log it names is kept
    shutil.rmtree(Path(log.group(1)).parent)


# -- refusals by the coordinator ------------------------------------------------------------------------------


def test_a_refused_command_is_one_line_with_the_status_of_its_kind(cluster: Cluster) -> None:
    """The coordinator's refusals come back as classes (netstack/errors.py), each with its exit status."""
    cluster.start_coordinator()
    for command in (("status", "job-nope"), ("cancel", "job-nope")):
        proc = client(cluster, *command)
        assert proc.returncode == 3, proc  # no such job
        assert_one_line(proc, f"sluice {command[0]}: no job job-nope", "sluice status")
    proc = client(cluster, "rescale", "job-nope", "--parallelism", "2")
    assert proc.returncode == 3, proc
    proc = client(cluster, "submit", "nomodule:build")  # no worker has registered: nothing can be placed
    assert proc.returncode == 2, proc  # an invalid request, as the coordinator judges it
    assert_one_line(proc, "sluice submit:")


# -- sluice local ---------------------------------------------------------------------------------------------


def test_wrong_job_module_is_one_error_before_anything_starts(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = sluice("local", "no_such_job_module:build", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = assert_one_line(proc, "no_such_job_module")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # once, not once per process
    assert "starting" not in proc.stdout and "pid" not in proc.stdout, proc.stdout
    assert error.startswith("sluice local:"), error
    assert time.monotonic() - started < 10, "a wrong name must not wait for a cluster"


def test_local_writes_its_token_for_client_commands_and_removes_its_logs(tmp_path: Path) -> None:
    write_module(tmp_path, "endless", ENDLESS_JOB)
    env = child_env("unused", str(tmp_path))
    env.pop("SLUICE_TOKEN")  # the client must find the local cluster's own random token
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "local", "endless:build", "--workers", "1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while not any("token in " in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, f"no token line in {seen}"
            seen.append(proc.stdout.readline())
        text = "".join(seen)
        rpc = re.search(r"rpc (\S+)", text)
        where = re.search(r"token in (\S+): pass --state-dir (\S+) ", text)
        logs = re.search(r"logs in (\S+)", text)
        assert rpc and where and logs, text
        token_path, state_dir, log_dir = Path(where.group(1)), where.group(2), Path(logs.group(1))
        assert token_path == Path(state_dir) / "token"
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        # a client command finds the token through --state-dir alone
        status = sluice("status", "--coordinator", rpc.group(1), "--state-dir", state_dir, cwd=tmp_path, env=env)
        assert status.returncode == 0, status.stderr
        assert "workers: 1" in status.stdout, status.stdout
        assert "development token" not in status.stderr, status.stderr
        assert log_dir.is_dir()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not log_dir.exists(), f"{log_dir} was left behind: {sorted(os.listdir(log_dir))}"


# -- sluice data without PySpark ------------------------------------------------------------------------------


def test_data_without_pyspark_says_how_to_install_it(tmp_path: Path) -> None:
    # sys.modules[name] = None makes the import system report the package as absent, as in a plain install
    proc = sluice("data", "generate", str(tmp_path / "out"), "--rows", "10", "--keys", "2", cwd=tmp_path,
                  python_prelude="import sys; sys.modules['pyspark'] = None")
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc, "sluice-dataflow[spark]")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- extras that are not installed ----------------------------------------------------------------------------

PARQUET_JOB = '''
from runtime.api import DiscardSink, ParquetSource


def build(job):
    job.source(ParquetSource("in/")).sink(DiscardSink())
'''


def test_local_with_a_job_that_needs_an_absent_extra_is_one_line_with_the_install_line(tmp_path: Path) -> None:
    write_module(tmp_path, "parquetjob", PARQUET_JOB)
    proc = sluice("local", "parquetjob:build", "--workers", "1", cwd=tmp_path,
                  python_prelude="import sys; sys.modules['pyarrow'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = assert_one_line(proc, "sluice local: job parquetjob:build: the `parquet` extra is not installed",
                            "pip install 'sluice-dataflow[parquet]'")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "pid" not in proc.stdout and error.startswith("sluice local:"), "refused before anything started"


def test_the_coordinator_refuses_at_submit_a_job_whose_extra_it_lacks(cluster: Cluster) -> None:
    # a coordinator in which rocksdict does not import, as in an install without the rocksdb extra
    hide = cluster.tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['rocksdict'] = None\n")
    cluster.local.env_overrides["PYTHONPATH"] = f"{hide}{os.pathsep}{cluster.env['PYTHONPATH']}"
    cluster.start_coordinator()
    cluster.local.env_overrides.clear()
    cluster.start_worker()
    cluster.wait_workers(1)
    write_module(cluster.tmp_path, "keyedjob", KEYED_JOB)
    with pytest.raises(RpcError) as refused:
        cluster.call("submit", {"entry": "keyedjob:build", "config": {"state": {"backend": "rocksdb"}},
                                "sys_path": str(cluster.tmp_path)})
    assert refused.value.remote_type == "MissingExtra", refused.value
    assert "pip install 'sluice-dataflow[rocksdb]'" in str(refused.value), refused.value
    assert cluster.call("status")["jobs"] == [], "nothing was deployed"
    job_id = cluster.submit("keyedjob:build")  # the memory backend needs no extra
    assert cluster.wait_job(job_id, 60)["state"] == "FINISHED"


KEYED_JOB = '''
from runtime.api import DiscardSink, GeneratorSource


def build(job):
    job.source(GeneratorSource(count=1000, keys=10)).key_by(lambda r: r[0]).reduce(lambda a, b: b).sink(DiscardSink())
'''
