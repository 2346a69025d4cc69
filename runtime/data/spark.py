"""Starting and stopping a quiet SparkSession, after checking that Java 17 and PySpark are there.

Spark needs a JVM; without one, PySpark fails with a long Py4J/launcher
trace that does not say what to install. So `check_environment` looks for
`java` the way Spark's launcher does (JAVA_HOME/bin/java when JAVA_HOME is
set, else `java` on PATH) and for the pyspark package, and raises DataError
with the exact thing to install. pyspark is imported only after that.

The session writes nothing into the current directory: its scratch space
(spark.local.dir), warehouse and log configuration live in one temporary
directory that `stop_session` removes.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from runtime.common.extras import install_line

JAVA_HINT = ("sluice data needs Java 17: install a JDK 17 (apt-get install openjdk-17-jre-headless) "
             "and make sure `java` is on PATH or JAVA_HOME is set")
PYSPARK_HINT = (f"sluice data needs PySpark and pyarrow, the `spark` extra: {install_line('spark')} "
                "(scripts/bootstrap.sh does)")
MIN_JAVA = 17  # Spark 4 is built for Java 17
CONNECT_SCHEME = "sc://"
CONNECT_MODULES = ("grpc", "grpc_status", "google.rpc", "pandas")  # what pyspark's Connect client imports

# Spark's own logging goes to stderr at WARN. Two warnings printed on every start, both harmless here, are
# silenced: Hadoop's "no native library", and SparkConf's note that a cluster manager may override
# spark.local.dir. So is WindowExec's warning that a window without partitions runs in one partition: the
# watermark of a windowed query (verify.py) is a running max over the whole input in read order, on purpose.
LOG4J2_CONFIG = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = spark %p %c{1}: %m%n%ex
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
logger.sparkconf.name = org.apache.spark.SparkConf
logger.sparkconf.level = error
logger.windowexec.name = org.apache.spark.sql.execution.window.WindowExec
logger.windowexec.level = error
"""

_TMPDIR_CONF = "spark.sluice.tmpdir"  # where a session keeps its scratch space, for stop_session


class DataError(Exception):
    """A problem the user must fix (missing Java/PySpark, bad argument, missing input): exit status 2."""


def find_java() -> str | None:
    """The java binary Spark's launcher would run, or None."""
    home = os.environ.get("JAVA_HOME")
    if home:  # spark-class uses $JAVA_HOME/bin/java whenever JAVA_HOME is non-empty
        path = os.path.join(home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java")


def java_major_version(java: str) -> int | None:
    """17 for 'openjdk version "17.0.15"', 8 for '"1.8.0_392"'; None if it cannot be told."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is not there
        return False


def is_connect(master: str) -> bool:
    """A running Spark Connect server (`sc://host:port`): the session is a client of it, no JVM of ours."""
    return master.startswith(CONNECT_SCHEME)


def check_environment(master: str = "local[2]") -> None:
    """Raise DataError naming what to install if Java (17 or later) or PySpark is missing (for a Spark Connect
    master: the Connect client's modules; the server has the JVM)."""
    # PySpark and pyarrow first: the cheap check, and a plain install leaves them out.
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        raise DataError(PYSPARK_HINT)
    if is_connect(master):
        missing = [m for m in CONNECT_MODULES if not _importable(m)]
        if missing:
            raise DataError(f"--master {master} needs the Spark Connect client ({', '.join(missing)} missing): "
                            f"{install_line('spark-connect')}")
        return
    java = find_java()
    if java is None:
        home = os.environ.get("JAVA_HOME")
        where = f" (JAVA_HOME is {home!r} but has no bin/java)" if home else ""
        raise DataError(JAVA_HINT + where)
    major = java_major_version(java)
    if major is not None and major < MIN_JAVA:
        raise DataError(f"{JAVA_HINT} ({java} is Java {major})")


def start_session(master: str = "local[2]", app_name: str = "sluice-data", *,
                  shuffle_partitions: int = 8) -> Any:
    """A SparkSession on `master`, quiet on stderr, with its scratch space in a fresh temporary directory; for
    `sc://host:port`, a Spark Connect session on that running server (started once and kept warm: no JVM start
    per command; the server reads and writes the paths, so they must be the same on its machine)."""
    check_environment(master)
    if is_connect(master):
        from pyspark.sql import SparkSession

        try:
            session = SparkSession.builder.remote(master).appName(app_name).getOrCreate()
            session.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        except Exception as exc:  # the client's errors (gRPC unavailable, a bad URL) as one line
            raise DataError(f"Spark Connect server {master}: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'unreachable'}") from None
        return session
    tmp = tempfile.mkdtemp(prefix="sluice-spark-")
    log_config = os.path.join(tmp, "log4j2.properties")
    with open(log_config, "w", encoding="utf-8") as f:
        f.write(LOG4J2_CONFIG)
    # Spark's launcher reads these from the environment of this process when it starts the JVM.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        # Without it Spark warns on every start that the hostname resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # py4j logs every connection at INFO

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.local.dir", os.path.join(tmp, "local"))
             .config("spark.sql.warehouse.dir", os.path.join(tmp, "warehouse"))
             .config("spark.driver.extraJavaOptions",
                     f"-Dlog4j2.configurationFile=file:{log_config} -Dderby.system.home={tmp}")
             # The data sets are small enough that Spark's default of 200 shuffle partitions only adds tasks.
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .config(_TMPDIR_CONF, tmp)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_session(spark: Any) -> None:
    """Stop the session and remove its temporary directory (a Spark Connect session: only the client's session
    ends, the server stays up for the next command)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        spark.stop()
        return
    tmp = spark.sparkContext.getConf().get(_TMPDIR_CONF)
    spark.stop()
    if tmp and os.path.basename(tmp).startswith("sluice-spark-"):
        shutil.rmtree(tmp, ignore_errors=True)
