"""A real S3-compatible server for the tests: moto's server (`moto[server]`, the test extra) in its own process.

    with S3Server.start() as s3:               # port 0; the readiness line gives the port
        s3.create_bucket("ckpt")
        env = s3.env                            # AWS_ENDPOINT_URL and test credentials, for sluice processes

It speaks the S3 REST API over HTTP (PUT/GET/HEAD/DELETE, list v2, multi-delete and conditional PUT with
`If-None-Match: *`), which is all sluice's object store uses. Stopped by PID (terminate, wait, kill).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from types import TracebackType

_SERVER = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address=sys.argv[1], port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"s3 server ready {host} {port}", flush=True)
while True:
    time.sleep(3600)
"""

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sluice-test", "AWS_SECRET_ACCESS_KEY": "sluice-test-secret",
               "AWS_REGION": "us-east-1"}


class S3ServerUnavailable(RuntimeError):
    pass


@dataclass
class S3Server:
    proc: subprocess.Popen[str]
    host: str
    port: int

    @classmethod
    def start(cls, host: str = "127.0.0.1", *, prefix: list[str] | None = None, timeout_s: float = 60.0) -> S3Server:
        """Start the server on `host`, port 0 (`prefix`, e.g. `ip netns exec NS`, runs it elsewhere)."""
        try:
            import moto.server  # noqa: F401
        except ImportError:
            raise S3ServerUnavailable("moto[server] is not installed (the test extra)") from None
        proc = subprocess.Popen([*(prefix or []), sys.executable, "-c", _SERVER, host], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        found: list[str] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("s3 server ready") and not found:
                    found.append(line)
            # keep draining so the server never blocks on a full pipe

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not found:
            _stop(proc)
            raise S3ServerUnavailable(f"the S3 server did not start within {timeout_s}s (status {proc.poll()})")
        _, _, _, bound, port = found[0].split()
        return cls(proc, host if host != "0.0.0.0" else "127.0.0.1", int(port))

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    def create_bucket(self, name: str) -> None:
        with urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"),
                                    timeout=30) as response:
            assert response.status == 200, response.status

    def pause(self) -> None:
        """SIGSTOP: the server keeps its port and accepts connections (the kernel's backlog) but answers nothing,
        as a hung or partitioned store does. `resume` (or `stop`) ends it."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        _stop(self.proc)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a paused server would not act on SIGTERM
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    with contextlib.suppress(Exception):
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def client_env(server: S3Server):  # type: ignore[no-untyped-def]
    """This process's environment pointed at `server` (for in-process storage calls); restored after."""
    from runtime.common import objectstore

    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    objectstore.forget_clients()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        objectstore.forget_clients()
