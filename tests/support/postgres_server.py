"""A real PostgreSQL 15 server for tests: initdb in a temporary directory, a free port, readiness from its log,
stopped by PID.

The binaries are Debian's (`apt-get install postgresql`, which scripts/bootstrap.sh does as root when they are
missing): /usr/lib/postgresql/15/bin. The server runs with logical replication (wal_level=logical, replication
slots and WAL senders) and two-phase commit (max_prepared_transactions) for the CDC source and the exactly-once
sink, fsync off (a test server: a kill -9 of the server still keeps every committed transaction, since the
WAL is written before the commit returns; only an OS crash would lose it), and the C locale so text keys
sort by code point, as Python compares them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

BIN_DIRS = ("/usr/lib/postgresql/15/bin",)
READY_LINE = "database system is ready to accept connections"


def postgres_bin_dir() -> str | None:
    """Where initdb and postgres are, or None when PostgreSQL 15 is not installed."""
    for directory in BIN_DIRS:
        if os.path.exists(os.path.join(directory, "initdb")):
            return directory
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demote() -> tuple[int, int] | None:
    """PostgreSQL refuses to run as root: (uid, gid) of an unprivileged user to run it as, when we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


class PostgresServer:
    """One server in a temporary directory of its own (`remove` deletes it) on a free port; `dsn` connects as
    the superuser `sluice` to database `sluice`."""

    def __init__(self, *, ready_timeout_s: float = 60.0) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise FileNotFoundError("PostgreSQL 15 is not installed (apt-get install postgresql)")
        self.bin_dir = bin_dir
        # a directory of its own, not pytest's: run as root, the server runs as another user, who must reach
        # it, and pytest keeps resetting its own base directory to owner-only
        data_dir = Path(tempfile.mkdtemp(prefix="sluice-postgres-"))
        self.data_dir = data_dir
        self.ready_timeout_s = ready_timeout_s
        self.user = _demote()
        self.log_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.socket_dir = data_dir / "sock"
        self.socket_dir.mkdir()
        if self.user is not None:
            for path in (data_dir, self.socket_dir):
                os.chown(path, *self.user)
        self.pgdata = data_dir / "pgdata"
        self._run([os.path.join(bin_dir, "initdb"), "-D", str(self.pgdata), "-U", "sluice", "--auth=trust",
                   "--no-locale", "-E", "UTF8", "--no-sync"])
        with open(self.pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n".join([
                "", "wal_level = logical", "max_prepared_transactions = 20", "max_replication_slots = 10",
                "max_wal_senders = 10", "fsync = off", "synchronous_commit = on", "full_page_writes = off",
                "shared_buffers = 32MB", "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.socket_dir}'",
                "wal_sender_timeout = 10s", "log_min_messages = warning", "log_statement = none", ""]))
        with open(self.pgdata / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        self.port = free_port()
        self.start()
        self.admin("CREATE DATABASE sluice")

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=sluice dbname=sluice connect_timeout=5"

    def _run(self, argv: list[str]) -> None:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=self._preexec())
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {result.stderr.strip()[-2000:]}")

    def _preexec(self):  # type: ignore[no-untyped-def]
        user = self.user
        if user is None:
            return None

        def demote() -> None:
            os.setgid(user[1])
            os.setuid(user[0])
        return demote

    def start(self) -> None:
        """Start (or restart after `kill`) on the same port and data; returns once it accepts connections.
        A restart may find its port briefly taken (another process probing for a free port got it while
        the server was down): the server then exits at once, and is started again."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                self._start_once()
                return
            except RuntimeError:
                if time.monotonic() > deadline or not any("could not bind" in line or "could not create any"
                                                          in line for line in self.log_lines):
                    raise
                time.sleep(0.3)

    def _start_once(self) -> None:
        self.log_lines = []
        self.proc = subprocess.Popen(
            [os.path.join(self.bin_dir, "postgres"), "-D", str(self.pgdata), "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=self._preexec())
        ready = threading.Event()
        proc = self.proc

        def read_log() -> None:  # keeps draining the pipe after readiness, so the server never blocks on it
            assert proc.stderr is not None
            for line in proc.stderr:
                self.log_lines.append(line.rstrip())
                if READY_LINE in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        if not ready.wait(self.ready_timeout_s) or proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"postgres did not become ready: {self.log_lines[-10:]}")
        self._wait_accepting(time.monotonic() + self.ready_timeout_s)

    def _wait_accepting(self, deadline: float) -> None:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                    raise RuntimeError(f"postgres on port {self.port} does not accept connections: "
                                       f"{self.log_lines[-10:]}") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def psql(self, sql: str, *, database: str = "sluice") -> str:
        """Run `sql` through psql; its output, unaligned and without headers."""
        result = subprocess.run(
            [os.path.join(self.bin_dir, "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "sluice",
             "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql],
            capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout

    def admin(self, sql: str) -> str:
        return self.psql(sql, database="postgres")

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it forked: a crash, recovered by the next start.

        Each backend makes itself a process-group leader (so the postmaster can signal it with its own children),
        so killing the postmaster's group leaves them running until they notice its death; on a loaded machine a
        restart then met their shared memory still attached ("pre-existing shared memory block is still in
        use"). They are killed by PID and waited for."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        forked = _children(proc.pid)
        for pid in [proc.pid, *forked]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in forked):
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres backends {[p for p in forked if _running(p)]} outlived SIGKILL for 30 s")
            time.sleep(0.02)
        pidfile = self.pgdata / "postmaster.pid"
        if pidfile.exists():
            pidfile.unlink()

    def stop(self) -> None:
        """pg_ctl stop -m immediate, then SIGKILL of the process group; by PID."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            self._run([os.path.join(self.bin_dir, "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", "immediate",
                       "-w", "-t", "20"])
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def remove(self) -> None:
        """Stop, and delete the data directory."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state, ppid, ...), or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[1]) == parent:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Still holding what it had: alive and not yet a zombie (a zombie has released its memory)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"
