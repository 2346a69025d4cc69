"""Starting and stopping sluice processes: readiness lines and terminate -> wait -> kill.

Used by `sluice local`, the demo, the benchmarks and the tests, so that
every caller starts processes on port 0, learns their ports from the
readiness line, and never leaves one behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

READY = re.compile(r"^sluice (coordinator|worker) ready (.*)$")


class ProcessStartError(RuntimeError):
    pass


@dataclass
class Managed:
    role: str
    proc: subprocess.Popen[str]
    fields: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None
    # the thread copying its stderr into `log_path`: a line written just before the process ended may still be
    # on its way to the file when the process is seen to end
    log_pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout_s: float) -> int:
        """Wait for the process to end (subprocess.TimeoutExpired past `timeout_s`), then for its log to hold
        everything it wrote; its exit code."""
        code = self.proc.wait(timeout_s)
        self.log_written()
        return code

    def log_written(self, timeout_s: float = 10.0) -> None:
        """Once the process ended: wait (up to `timeout_s`) until its stderr is all in its log."""
        if self.log_pump is not None and self.proc.poll() is not None:
            self.log_pump.join(timeout_s)

    def address(self, key: str) -> tuple[str, int]:
        host, _, port = self.fields[key].rpartition(":")
        return host, int(port)


def sluice_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", *args]


def _pump(stream: IO[str], sink: IO[str] | None) -> None:
    for line in stream:
        if sink is not None:
            sink.write(line)
            sink.flush()


def start_process(role: str, args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                  log_path: str | None = None, timeout_s: float = 60.0, prefix: list[str] | None = None) -> Managed:
    """Start `sluice <role> ...` and wait for its readiness line; stderr goes to `log_path` (or ours).

    `prefix` runs the command under a launcher, e.g. `ip netns exec NS` for a worker in a network namespace.
    """
    stderr_sink = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115 - closed by reader
    proc = subprocess.Popen([*(prefix or []), *sluice_command(role, *args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, bufsize=1)
    assert proc.stdout is not None and proc.stderr is not None
    log_pump = threading.Thread(target=_pump, args=(proc.stderr, stderr_sink or sys.stderr), daemon=True)
    log_pump.start()
    deadline = time.monotonic() + timeout_s
    fields: dict[str, str] = {}
    lines: list[str] = []
    result: dict[str, str] = {}

    def read_ready() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = READY.match(line.strip())
            if match:
                result["line"] = match.group(2)
                break

    reader = threading.Thread(target=read_ready, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if "line" not in result:
        code = stop_process(Managed(role, proc, log_pump=log_pump))
        where = f" (log: {log_path})" if log_path else ""
        how = f"exited with status {code}" if time.monotonic() < deadline else f"was not ready within {timeout_s}s"
        reason = _last_line(log_path)  # the child's own one-line error, e.g. a port in use
        raise ProcessStartError(f"sluice {role} {how}{': ' + reason if reason else ''}{where}"
                                + (f"; output: {''.join(lines)!r}" if lines else ""))
    for part in result["line"].split():
        key, _, value = part.partition("=")
        fields[key] = value
    # a worker's stdout is what its print sinks write (PrintSink, SQL 'print' tables): shown with ours
    threading.Thread(target=_pump, args=(proc.stdout, sys.stdout if role == "worker" else None),
                     daemon=True).start()
    return Managed(role, proc, fields, log_path, log_pump)


def _last_line(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4096:].splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def stop_process(managed: Managed, *, timeout_s: float = 10.0) -> int | None:
    """terminate -> wait -> kill; returns the exit code."""
    proc = managed.proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    managed.log_written()
    return proc.returncode


def child_env(token: str, extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["SLUICE_TOKEN"] = token
    paths = [p for p in [extra_path, _project_root(), env.get("PYTHONPATH", "")] if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _project_root() -> str:
    """The directory holding the runtime/, netstack/ and coordinator/ packages."""
    return str(Path(__file__).resolve().parents[2])
