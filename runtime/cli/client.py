"""A short-lived RPC client of the coordinator, for the CLI and tests."""

from __future__ import annotations

import secrets
import time
from typing import Any

from netstack.connection import Connection
from netstack.tls import TlsFiles, client_context
from netstack.transport import BaseLinkHandler, Link, dial
from runtime.graph.enums import JobState

JOB_ENDED = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})


async def _open(host: str, port: int, token: str, timeout_s: float, tls: TlsFiles | None = None) -> Link:
    conn = Connection(local_id=f"cli-{secrets.token_hex(3)}", role="client", token=token, is_client=True)
    return await dial(host, port, conn, BaseLinkHandler(), timeout_s=timeout_s,
                      ssl_context=client_context(tls) if tls else None)


async def call_coordinator(host: str, port: int, token: str, method: str, args: dict[str, Any] | None = None, *,
                           timeout_s: float = 30.0, tls: TlsFiles | None = None) -> Any:
    link = await _open(host, port, token, timeout_s, tls)
    try:
        return await link.call(method, args or {}, timeout_s=timeout_s)
    finally:
        link.close("done")


async def wait_job(host: str, port: int, token: str, job_id: str, *, timeout_s: float | None = None,
                   call_s: float = 60.0, tls: TlsFiles | None = None) -> dict[str, Any]:
    """The job's summary once it has ended, or after `timeout_s` (None: no limit) with the job still going.

    One connection; the coordinator answers each `wait_job` call when the job
    ends or after `call_s`, so a wait of hours is a call a minute, not a poll.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    link = await _open(host, port, token, 30.0, tls)
    try:
        while True:
            wait_s = call_s if deadline is None else max(0.0, min(call_s, deadline - time.monotonic()))
            summary: dict[str, Any] = await link.call("wait_job", {"job_id": job_id, "timeout_s": wait_s},
                                                      timeout_s=wait_s + 30.0)
            if summary["state"] in JOB_ENDED or (deadline is not None and time.monotonic() >= deadline):
                return summary
    finally:
        link.close("done")
