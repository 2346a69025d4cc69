"""The lookup service of runtime/examples/lookup_service.py as a real process for the tests: started on port 0,
its port read from its readiness line, stopped by PID (terminate, wait, kill)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def lookup_service(latency_ms: float = 20.0, fail_every: int = 0, timeout_s: float = 15.0) -> Iterator[int]:
    """The port of a running lookup service; the process is gone when the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "runtime.examples.lookup_service", "--port", "0",
                             "--latency-ms", str(latency_ms), "--fail-every", str(fail_every)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = ""
        while not line.startswith("listening on "):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"the lookup service did not start (exit {proc.poll()})"
            if select.select([proc.stdout], [], [], left)[0]:
                line = proc.stdout.readline()
        yield int(line.split()[-1])
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
