"""A short-lived RPC client of the coordinator, for the CLI and tests."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from netstack.connection import Connection
from netstack.errors import (
    CloseReason,
    ConnectionLost,
    InvalidRequest,
    JobNotFound,
    MethodNotFound,
    NetstackError,
    NotLeader,
    RpcError,
)
from netstack.tls import TlsFiles, client_context
from netstack.transport import BaseLinkHandler, Link, dial
from runtime.common.backoff import backoff_delays
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.enums import JobState

R = TypeVar("R", bound=r.Reply)

JOB_ENDED = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})


async def open_link(host: str, port: int, token: str, timeout_s: float, tls: TlsFiles | None = None) -> Link:
    """A client's connection to one coordinator (the caller closes it)."""
    conn = Connection(local_id=f"cli-{secrets.token_hex(3)}", role="client", token=token, is_client=True)
    return await dial(host, port, conn, BaseLinkHandler(), timeout_s=timeout_s,
                      ssl_context=client_context(tls) if tls else None)


async def call_coordinator(host: str, port: int, token: str, method: str, args: dict[str, Any] | None = None, *,
                           timeout_s: float = 30.0, tls: TlsFiles | None = None) -> Any:
    link = await open_link(host, port, token, timeout_s, tls)
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
    link = await open_link(host, port, token, 30.0, tls)
    try:
        while True:
            wait_s = call_s if deadline is None else max(0.0, min(call_s, deadline - time.monotonic()))
            summary: dict[str, Any] = await link.call("wait_job", {"job_id": job_id, "timeout_s": wait_s},
                                                      timeout_s=wait_s + 30.0)
            if summary["state"] in JOB_ENDED or (deadline is not None and time.monotonic() >= deadline):
                return summary
    finally:
        link.close("done")


Address = tuple[str, int]

# exit statuses of client commands the coordinator refused, by what kind of refusal it was (README, CLI)
EXIT_REFUSED = 1  # the job's state does not allow it now, or the caller may not (Conflict, Forbidden, others)
EXIT_INVALID = 2  # the request is wrong, as a bad command line is (InvalidRequest)
EXIT_NO_JOB = 3  # no such job (JobNotFound)


def refusal(exc: RpcError) -> tuple[int, str]:
    """The exit status and one line for a refused call: the coordinator's message, and what to do about it."""
    if isinstance(exc, JobNotFound):
        return EXIT_NO_JOB, f"{exc} (`sluice status` lists the jobs the coordinator knows)"
    if isinstance(exc, InvalidRequest):
        return EXIT_INVALID, str(exc)
    if isinstance(exc, MethodNotFound):
        return EXIT_REFUSED, f"{exc}: the coordinator runs another version of sluice"
    return EXIT_REFUSED, str(exc)


def coordinator_unavailable(exc: NetstackError) -> bool:
    """A coordinator that is not there (refused, unreachable) or not leading: another try may find one. A wrong
    token or certificate is not (the worker's twin: runtime/worker/worker.py)."""
    if isinstance(exc, NotLeader):
        return True
    return isinstance(exc, ConnectionLost) and exc.reason in (CloseReason.IO_ERROR, CloseReason.TIMEOUT)
LEADER_RETRY_S = 10.0  # how long a command keeps looking for a leader (a coordinator restarting, a standby taking over)


async def call_leader(addresses: Sequence[Address], token: str, method: str, args: dict[str, Any] | None = None, *,
                      timeout_s: float = 30.0, tls: TlsFiles | None = None, retry_s: float = LEADER_RETRY_S) -> Any:
    """Call `method` on the leading coordinator among `addresses`: each in turn, and again with backoff for up to
    `retry_s` while every one refuses the connection or answers NotLeader (the call did not run there, so trying
    it elsewhere is safe). Any other error, and a connection lost during the call, is raised as it is."""
    deadline = time.monotonic() + retry_s
    delays = backoff_delays(base_s=0.1, cap_s=1.0)
    while True:
        errors = []
        for host, port in addresses:
            try:
                link = await open_link(host, port, token, min(timeout_s, 10.0), tls)
            except NetstackError as exc:
                if not coordinator_unavailable(exc):
                    raise
                errors.append(str(exc))
                continue
            try:
                return await link.call(method, args or {}, timeout_s=timeout_s)
            except RpcError as exc:
                if not coordinator_unavailable(exc):
                    raise
                errors.append(f"{host}:{port}: {exc}")
            finally:
                link.close("done")
        if time.monotonic() >= deadline:
            raise ConnectionLost(f"no leading coordinator within {retry_s:g}s: {'; '.join(errors)}",
                                 CloseReason.TIMEOUT)
        await asyncio.sleep(next(delays))


async def ask_leader(addresses: Sequence[Address], token: str, message: p.Message[R], *, timeout_s: float = 30.0,
                     tls: TlsFiles | None = None, retry_s: float = LEADER_RETRY_S) -> R:
    """`call_leader` with a typed request; its typed reply (BadReply when the answer does not fit it)."""
    answer = await call_leader(addresses, token, message.method, message.to_wire(), timeout_s=timeout_s, tls=tls,
                               retry_s=retry_s)
    return message.reply_type().from_wire(answer)


async def wait_job_on_leader(addresses: Sequence[Address], token: str, job_id: str, *,
                             timeout_s: float | None = None, call_s: float = 60.0, tls: TlsFiles | None = None,
                             outage_s: float = 120.0) -> r.JobSummary:
    """`wait_job` that outlives a coordinator failover: when the connection breaks, wait for a leader (the
    restarted coordinator or a standby, which knows the job from its records) for up to `outage_s`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait_s = call_s if deadline is None else max(0.0, min(call_s, deadline - time.monotonic()))
        try:
            summary = await ask_leader(addresses, token, p.WaitJob(job_id, timeout_s=wait_s),
                                       timeout_s=wait_s + 30.0, tls=tls, retry_s=outage_s)
        except ConnectionLost as exc:
            if exc.reason not in (CloseReason.PEER_CLOSED, CloseReason.IO_ERROR):
                raise
            continue  # the coordinator went away during the wait: look for the next leader
        if summary.state in JOB_ENDED or (deadline is not None and time.monotonic() >= deadline):
            return summary
