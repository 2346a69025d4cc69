"""A Kafka-protocol broker for tests: noida-db's Kafka service on a free port, readiness from its output,
stopped by PID; or a real Apache Kafka named by SLUICE_KAFKA_BOOTSTRAP.

noida-db (the `noida-db` test dependency) is one binary with several services; `noida-db start --only kafka
--kafka-port 0` binds any free port and prints "  kafka          127.0.0.1:PORT" and then "press Ctrl-C to
stop" once it serves. `restart()` starts it again on the same port and data directory (a broker that comes
back after a kill -9). With SLUICE_KAFKA_BOOTSTRAP=host:port set, every broker test runs against that broker
instead (topics get unique names per test), and the tests that kill the broker are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import threading
import uuid
from pathlib import Path

KAFKA_LINE = re.compile(r"^\s*kafka\s+([\d.]+):(\d+)\s*$")
READY_LINE = "press Ctrl-C to stop"
EXTERNAL = "SLUICE_KAFKA_BOOTSTRAP"


def noida_binary() -> str | None:
    """The binary itself, inside the noida_db package: the `noida-db` command is a Python wrapper that runs it
    as a child, so a signal to the wrapper's PID would leave the broker running."""
    spec = importlib.util.find_spec("noida_db")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "noida-db"
    return str(binary) if binary.exists() else None


class KafkaBroker:
    """`bootstrap` is host:port. `external` when it is SLUICE_KAFKA_BOOTSTRAP's broker (never started or
    stopped here)."""

    def __init__(self, data_dir: Path, *, ready_timeout_s: float = 30.0) -> None:
        self.data_dir = data_dir
        self.ready_timeout_s = ready_timeout_s
        self.log_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.suffix = uuid.uuid4().hex[:8]  # topic and group names unique to this test (a shared broker)
        external = os.environ.get(EXTERNAL)
        self.external = bool(external)
        if external:
            self.bootstrap = external
            return
        self.port = 0
        self._start()

    def _start(self) -> None:
        binary = noida_binary()
        if binary is None:
            raise FileNotFoundError("noida-db not found (install the test dependencies: noida-db)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_lines.clear()
        proc = subprocess.Popen(
            [binary, "start", "--data-dir", str(self.data_dir), "--only", "kafka", "--kafka-port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True)
        self.proc = proc
        self.pid = proc.pid
        ready = threading.Event()
        found: dict[str, int] = {}

        def read_output() -> None:  # keeps draining the pipe after readiness, so the broker never blocks on it
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log_lines.append(line.rstrip())
                if m := KAFKA_LINE.match(line):
                    found["port"] = int(m.group(2))
                if READY_LINE in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read_output, daemon=True).start()
        if not ready.wait(self.ready_timeout_s) or "port" not in found or proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"noida-db's kafka did not become ready: {self.log_lines[-10:]}")
        self.port = found["port"]
        self.bootstrap = f"127.0.0.1:{self.port}"

    def topic(self, name: str) -> str:
        return f"{name}-{self.suffix}"

    def kill(self) -> None:
        """kill -9, by PID."""
        assert not self.external and self.proc is not None
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the broker hangs (connections stay open, nothing is answered) until `resume`."""
        assert not self.external and self.proc is not None
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert not self.external and self.proc is not None
        os.kill(self.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same port and data directory."""
        assert not self.external
        self._start()

    def stop(self) -> None:
        """terminate -> wait -> kill, by PID."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)  # a paused broker cannot act on SIGTERM
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
