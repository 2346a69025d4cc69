"""A real Spark Connect server for tests: the installed PySpark's own, on a free port, stopped by PID.

PySpark ships the server (jars/spark-connect_*.jar) and its launcher. The server runs in the foreground
(`spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`, which ends in an `exec` of the
JVM, so the PID we started is the JVM's), not through sbin/start-connect-server.sh, which daemonizes it and
leaves a PID file to go stale. It binds 127.0.0.1 on port 0 and logs the port it bound in its readiness line,
"Spark Connect server started at: [::]:PORT" (its logger is turned up to INFO for that line only); it is
stopped terminate -> wait -> kill. Its JVM compiles with C1 only (-XX:TieredStopAtLevel=1), which the tests'
small queries cost less CPU with. Its scratch space, warehouse and working directory are one directory the
caller owns, so it writes nothing into the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from runtime.data.spark import LOG4J2_CONFIG

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
READY_LINE = re.compile(r"Spark Connect server started at: \S*:(\d+)\s*$")

# the sessions' own logging (runtime/data/spark.py), and the server's start line, which tells its port
_LOG4J2 = LOG4J2_CONFIG + f"""\
logger.server.name = {SERVER_CLASS}
logger.server.level = info
"""


def connect_skip_reason() -> str | None:
    """Why a Spark Connect server and its client cannot run here (a line for pytest.skip), or None."""
    from runtime.data.spark import DataError, check_environment, find_java, java_major_version

    try:
        check_environment("sc://127.0.0.1:1")  # PySpark, pyarrow and the Connect client's modules; no Java
    except DataError as exc:
        return str(exc)
    java = find_java()
    if java is None:
        return "no Java: the Spark Connect server needs Java 17"
    major = java_major_version(java)
    if major is not None and major < 17:
        return f"{java} is Java {major}: the Spark Connect server needs Java 17"
    return None


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


class SparkConnectServer:
    """One Spark Connect server (`local[2]` inside) started in `work_dir`. The constructor only launches it, so
    its JVM starts while the caller goes on (the tests' own local Spark starts beside it); `wait_ready` waits
    for the readiness line and sets `port` and `url` (`sc://127.0.0.1:PORT`)."""

    def __init__(self, work_dir: Path) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        log_config = work_dir / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        self.log_lines: list[str] = []
        self.port = 0
        self.url = ""
        env = {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": sys.executable}
        command = [
            os.path.join(spark_home(), "bin", "spark-submit"), "--class", SERVER_CLASS, "--name", "sluice-tests",
            "--master", "local[2]",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.connect.grpc.binding.port=0",
            "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.local.dir={work_dir / 'local'}",
            "--conf", f"spark.sql.warehouse.dir={work_dir / 'warehouse'}",
            "--conf", "spark.sql.shuffle.partitions=2",
            # C1 only: the tests' queries are small, and C2's compiler threads cost more CPU than they save
            # (on two busy cores: 85 CPU-s for the Spark Connect tests with it, 94 to 106 without; docs/BENCHMARKS.md)
            "--driver-java-options", f"-Dlog4j2.configurationFile=file:{log_config} -Dderby.system.home={work_dir} "
                                      "-XX:TieredStopAtLevel=1",
        ]
        self._started = time.monotonic()
        self.start_s = 0.0
        self.proc = subprocess.Popen(command, cwd=work_dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.pid = self.proc.pid  # spark-submit execs the JVM: this is the server's own PID
        self._ready = threading.Event()
        self._port: list[int] = []
        threading.Thread(target=self._read_log, daemon=True, name="spark-connect-log").start()

    def _read_log(self) -> None:  # keeps draining the pipe after readiness, so the server never blocks on it
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line.rstrip())
            if not self._port and (m := READY_LINE.search(line.rstrip())):
                self._port.append(int(m.group(1)))
                self.start_s = time.monotonic() - self._started
                self._ready.set()
        self._ready.set()  # the server ended: no readiness line will come

    def wait_ready(self, timeout_s: float = 240.0) -> SparkConnectServer:
        """Wait for the readiness line (at most `timeout_s` from the launch); stop the server and raise if it
        does not come."""
        left = self._started + timeout_s - time.monotonic()
        if not self._ready.wait(max(left, 0.0)) or not self._port:
            self.stop()
            raise RuntimeError(f"the Spark Connect server did not report its port within {timeout_s:.0f} s "
                               f"(exit status {self.proc.poll()}): {self.log_lines[-10:]}")
        self.port = self._port[0]
        self.url = f"sc://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        """terminate -> wait -> kill, by PID (SIGTERM runs the JVM's shutdown hooks: Spark stops cleanly)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, 9)
                self.proc.wait(30)
