"""`sluice data state` against a warm Spark Connect server vs a local Spark per command (issue 31).

Starts a Spark Connect server from the installed PySpark (tests/support/spark_connect.py: foreground, port 0,
stopped by PID), then in a temporary directory with the README's `counts.py` and `wordcount.py` times, each as
its own `sluice data` process: `state bootstrap` of --keys keys (the first command the new server sees), then
`state read` of that savepoint --repeat times against the server, and --repeat times with the default local
Spark (a JVM per command). Every read must list --keys rows. Prints one line per command and the medians.

    .venv/bin/python scripts/bench_spark_connect.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.readme import readme_example  # noqa: E402
from tests.support.spark_connect import SparkConnectServer, connect_skip_reason  # noqa: E402


def timed(cwd: Path, *args: str) -> float:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "data", "state", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"sluice data state {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    print(f"{took:6.1f} s  sluice data state {' '.join(args)}: {proc.stdout.strip()}", flush=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reason = connect_skip_reason()
    if reason:
        raise SystemExit(reason)
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-connect-"))
    try:
        (work / "wordcount.py").write_text(readme_example("wordcount"))
        (work / "counts.py").write_text(readme_example("counts"))
        keys = [f"w{i}" for i in range(args.keys)]
        pq.write_table(pa.table({"key": keys, "state": ["count"] * len(keys), "value": list(range(len(keys)))}),
                       work / "count.parquet")
        started = time.monotonic()
        server = SparkConnectServer(work / "server").wait_ready()
        print(f"{time.monotonic() - started:6.1f} s  Spark Connect server start ({server.url})", flush=True)
        try:
            master = ("--master", server.url)
            first = timed(work, "bootstrap", "--uid", "count", "--job", "counts:build", "--from", "count.parquet",
                          "--key-col", "key", "-o", "initial", *master)
            warm = [timed(work, "read", "initial", "--uid", "count", "-o", f"connect-{i}.parquet", *master)
                    for i in range(args.repeat)]
        finally:
            server.stop()
        local = [timed(work, "read", "initial", "--uid", "count", "-o", f"local-{i}.parquet")
                 for i in range(args.repeat)]
        for name in [f"connect-{i}.parquet" for i in range(args.repeat)] + [f"local-{i}.parquet"
                                                                             for i in range(args.repeat)]:
            rows = pq.read_table(work / name).num_rows
            assert rows == args.keys, (name, rows)
        print(f"first command against the new server {first:.1f} s; warm read median {statistics.median(warm):.1f} s "
              f"(slowest {max(warm):.1f}); local read median {statistics.median(local):.1f} s (slowest "
              f"{max(local):.1f}); local / warm {statistics.median(local) / statistics.median(warm):.1f}x; "
              f"load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
