"""What the PyFlink side-by-side jobs (scripts/flink_*_job.py) share: a local mini cluster's environment with its
REST API on a free port, their checkpoint settings, a discarding sink, and reading the checkpoints triggered in
a measurement window from that REST API.

Imported only by those jobs, which run with the Python of a venv that has `apache-flink` installed (never
Sluice's): the job's own directory is first on sys.path, so `import flink_common` finds this file. PyFlink is
imported inside the functions, as in the jobs.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rest(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


def local_environment(parallelism: int, settings: dict[str, str] | None = None) -> tuple[Any, int]:
    """A StreamExecutionEnvironment on the local mini cluster at `parallelism`, its REST API on a free port,
    a long checkpoint history (the REST API keeps only 10 by default) and this venv's Python for the Python
    workers (they need its pyflink); `settings` are more configuration keys. Returns (env, REST port)."""
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment

    port = free_port()
    conf = Configuration()
    defaults = {"rest.port": str(port), "parallelism.default": str(parallelism), "web.checkpoints.history": "1000",
                "python.executable": sys.executable}
    for key, value in (defaults | (settings or {})).items():
        conf.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(parallelism)
    return env, port


def enable_checkpoints(env: Any, interval_s: float, *, unaligned: bool) -> None:
    """Exactly-once checkpoints every `interval_s`, one at a time, no pause between them, a 10 s timeout, and
    failures tolerated (the benchmarks count them)."""
    from pyflink.datastream import CheckpointingMode

    env.enable_checkpointing(int(interval_s * 1000), CheckpointingMode.EXACTLY_ONCE)
    cp = env.get_checkpoint_config()
    cp.enable_unaligned_checkpoints(unaligned)
    cp.set_checkpoint_timeout(10_000)
    cp.set_tolerable_checkpoint_failure_number(1000)
    cp.set_max_concurrent_checkpoints(1)
    cp.set_min_pause_between_checkpoints(0)


def discarding_sink() -> Any:
    """Flink's DiscardingSink (Java): the records end in the JVM, no Python sink function to pay for."""
    from pyflink.datastream.connectors.base import Sink
    from pyflink.java_gateway import get_gateway

    return Sink(get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink())


def checkpoints_in_window(port: int, job_id: str, started: float, warmup_s: float,
                          seconds: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait out `warmup_s` + `seconds` from `started` (wall clock), then return (the checkpoints triggered in the
    last `seconds`, the whole history), once those have ended or 12 s later: the window's last checkpoint may
    still be running, and the wait is bounded by the checkpoint timeout."""
    window_start_ms = (started + warmup_s) * 1000
    window_end_ms = window_start_ms + seconds * 1000
    while time.time() * 1000 < window_end_ms:
        time.sleep(0.5)
    deadline = time.time() + 12
    while True:
        history = rest(port, f"/jobs/{job_id}/checkpoints")["history"]
        window = [h for h in history if window_start_ms <= h["trigger_timestamp"] < window_end_ms]
        if all(h["status"] in ("COMPLETED", "FAILED") for h in window) or time.time() > deadline:
            return window, history
        time.sleep(0.2)
