"""The `sluice` command line: coordinator, worker, submit, status, cancel, local, demo.

Configuration is parsed and checked here, once, and passed down as frozen
dataclasses; a bad argument exits with status 2 and a one-line reason.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from netstack.errors import NetstackError, RpcError
from netstack.limits import ListenerLimits, raise_nofile_limit
from netstack.tls import TlsFiles, client_context, server_context
from netstack.transport import run
from runtime.common import objectstore
from runtime.common.addresses import check_advertise, check_host
from runtime.execution.async_operator import AsyncStateSettings
from runtime.graph.config import DEFAULT_INFLIGHT_TARGET_S, load_token, parse_address, parse_bytes, parse_duration
from runtime.state import registry as state_registry

if TYPE_CHECKING:
    from coordinator.server import CoordinatorConfig


def _duration(text: str, *, allow_zero: bool = False) -> float:
    """Every duration flag goes through here: more than zero, except those that say otherwise."""
    try:
        return parse_duration(text, allow_zero=allow_zero)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration_or_zero(text: str) -> float:
    return _duration(text, allow_zero=True)


def _scale_down_after(text: str) -> float:
    """A duration, or 0 / 'never' (0.0): never scale down."""
    return 0.0 if text.strip().lower() == "never" else _duration(text, allow_zero=True)


def _restart_window(text: str) -> float | str:
    """A duration, or 'life': count every restart of the job's life."""
    return "life" if text.strip().lower() == "life" else _duration(text)


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _addresses(text: str) -> tuple[tuple[str, int], ...]:
    """One coordinator, or the leader and its standbys (tried in turn: the leader answers)."""
    return tuple(_address(part.strip()) for part in text.split(",") if part.strip()) or (_address(text),)


def _host(text: str) -> str:
    try:
        return check_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def _advertise(text: str) -> str:
    try:
        return check_advertise(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def _storage_path(text: str) -> str:
    try:
        return objectstore.absolute(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_address_options(p: argparse.ArgumentParser, what: str, fallback: str) -> None:
    p.add_argument("--host", type=_host, default="127.0.0.1",
                   help=f"address to bind the {what} on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--advertise", type=_advertise, default=None, metavar="ADDRESS",
                   help=f"address other machines reach this one at (default: --host, or {fallback} when --host "
                        "is a wildcard)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def _add_job_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("network buffers")
    g.add_argument("--buffer-bytes", type=_positive, default=32 * 1024, help="network buffer size (default 32768)")
    g.add_argument("--buffers-per-channel", type=_positive, default=4,
                   help="output buffers a channel may queue before its task is backpressured (default 4)")
    g.add_argument("--exclusive-credits", type=_positive, default=2, help="receiver buffers per channel (default 2)")
    g.add_argument("--floating-credits", type=int, default=8, help="receiver buffers per gate lent on backlog (8)")
    g.add_argument("--flush-timeout", type=_duration, default=0.05, help="latency bound of a partial buffer (50ms)")
    g.add_argument("--inflight-target", type=_duration_or_zero, default=DEFAULT_INFLIGHT_TARGET_S,
                   help="in-flight data per channel in seconds of its throughput; buffers shrink to fit, which "
                        "bounds how long an aligned barrier waits (1s; 0 = fixed --buffer-bytes)")
    p.add_argument("--name", help="job name (default: the entry point)")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-interval", type=_duration, help="take a checkpoint every INTERVAL (e.g. 1s)")
    c.add_argument("--checkpoint-mode", choices=["aligned", "unaligned", "at-least-once"], default="aligned")
    c.add_argument("--no-incremental-channel-state", dest="incremental_channel_state", action="store_false",
                   help="unaligned checkpoints write every captured buffer, also those an earlier checkpoint "
                        "already persisted (default: reference those)")
    c.add_argument("--aligned-timeout", type=_duration,
                   help="aligned checkpoints switch to unaligned after this long (e.g. 100ms)")
    c.add_argument("--channel-timeout", type=_duration,
                   help="with aligned: a channel whose barrier has waited this long behind data switches to "
                        "unaligned on its own, the others stay aligned (e.g. 10ms)")
    c.add_argument("--channel-inflight", type=_bytes, metavar="BYTES",
                   help="with aligned: a channel whose barrier waits behind more than this much data switches to "
                        "unaligned on its own (e.g. 256KiB)")
    c.add_argument("--max-inflight", type=_bytes, metavar="BYTES",
                   help="with --channel-timeout/--channel-inflight: the most in-flight data a task persists per "
                        "checkpoint; a switch that does not fit stays aligned (e.g. 4MiB)")
    c.add_argument("--max-concurrent", type=_positive, default=1,
                   help="with unaligned: periodic checkpoints in flight at once (1)")
    c.add_argument("--checkpoint-timeout", type=_duration, default=60.0, help="abort a checkpoint after (60s)")
    c.add_argument("--min-pause", type=_duration_or_zero, default=0.0, help="pause between checkpoints (0)")
    c.add_argument("--tolerable-failures", type=int, default=3, help="consecutive failed checkpoints tolerated (3)")
    c.add_argument("--retain", type=_positive, default=3, help="completed checkpoints kept (3)")
    c.add_argument("--restore", metavar="PATH", help="start from this checkpoint or savepoint directory")
    c.add_argument("--allow-non-restored-state", action="store_true",
                   help="with --restore: drop the state of operators (by uid) the job no longer has, instead of "
                        "refusing the checkpoint (README: Evolving a job)")
    p.add_argument("--parallelism", metavar="N|NAME=N", type=_parallelism, action="append", default=[],
                   help="run every operator (N) or the one named NAME (NAME=N, repeatable) at this parallelism; "
                        "with --restore the checkpoint is redistributed to it")
    st = p.add_argument_group("keyed state (README: Choosing a state backend)")
    st.add_argument("--state-backend", choices=state_registry.KINDS, default=None,
                    help=f"where keyed state lives: {state_registry.help_text()}; default: the job's "
                         "Job.state_backend, else memory")
    st.add_argument("--state-remote-address", type=_address_text, metavar="HOST:PORT",
                    help="the state server of --state-backend remote")
    st.add_argument("--state-work-dir", metavar="DIR",
                    help="where workers keep local state (RocksDB instances; default: the system temp directory)")
    a = p.add_argument_group("asynchronous state (README: Asynchronous state; AsyncKeyedProcessFunction only)")
    a.add_argument("--async-max-in-flight", type=_positive, metavar="N",
                   help="records in flight per task before input waits (1000)")
    a.add_argument("--async-batch-size", type=_positive, metavar="N",
                   help="state requests per backend round trip at most (100)")
    a.add_argument("--async-batch-timeout", type=_duration_or_zero, metavar="DURATION",
                   help="a partial batch waits this long for more requests (1ms)")
    a.add_argument("--async-key-order", choices=["record", "first-state-access"],
                   help="records of one key: whole-record order (record, the default) or from their first state "
                        "access on (first-state-access)")
    a.add_argument("--async-epochs", choices=["strict", "out-of-order"],
                   help="records after a watermark wait for the ones before it (strict, the default) or start "
                        "at once (out-of-order); the watermark is forwarded after the ones before it either way")
    a.add_argument("--async-checkpoint", choices=["drain", "capture"],
                   help="at a barrier: wait for the records in flight (drain, the default, as Flink) or snapshot "
                        "at once and store them as input to replay (capture)")
    r = p.add_argument_group("restarts after a failure")
    r.add_argument("--restart-strategy", choices=["fixed", "exponential", "none"],
                   help="delay between restarts: fixed, exponential (the default: 1s, doubling up to 30s) or none")
    r.add_argument("--restart-attempts", type=int,
                   help="restarts allowed within --restart-window (8): a job that fails more often ends FAILED")
    r.add_argument("--restart-delay", type=_duration,
                   help="delay before a restart; the first one for exponential backoff (1s)")
    r.add_argument("--restart-window", type=_restart_window, metavar="DURATION|life",
                   help="count only the restarts of this last while against --restart-attempts (and grow the "
                        "exponential backoff with them), or of the job's whole life: the default, 5m, rides out "
                        "a minute-long outage of a dependency and still fails a job that fails again and again")
    r.add_argument("--scale-down-after", type=_scale_down_after, metavar="DURATION|never",
                   help="a restart that waited this long for the slots the job asks for restarts at the largest "
                        "parallelism the free slots allow (default: the coordinator's, 10s; 0 or never: wait)")


def _add_listener_options(p: argparse.ArgumentParser, port: str) -> None:
    g = p.add_argument_group(f"connections to the {port} port (the metrics port has its own small limits)")
    g.add_argument("--max-connections", type=_positive, default=1024,
                   help="connections held at once; beyond, the oldest one still in its handshake is dropped, "
                        "else the new one is refused (default 1024)")
    g.add_argument("--max-pending", type=_positive, default=128,
                   help="connections still in their handshake; a new one drops the oldest (default 128)")
    g.add_argument("--handshake-timeout", type=_duration, default=10.0,
                   help="close a connection that has not completed its handshake by then (10s)")


def _add_tls_options(p: argparse.ArgumentParser, listens: bool) -> None:
    g = p.add_argument_group("TLS (off unless given; docs/ARCHITECTURE.md, Trust model)")
    g.add_argument("--tls-cert", metavar="PEM", help="this process's certificate" + (
        " (needed to serve TLS)" if listens else " (for a listener that requires client certificates)"))
    g.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    g.add_argument("--tls-ca", metavar="PEM",
                   help="the cluster's CA: peers must present a certificate it signed (mutual TLS); without it, "
                        "a listener is checked against the system CAs and its host name")


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    return TlsFiles.from_options(args.tls_cert, args.tls_key, args.tls_ca)


def _listener_limits(args: argparse.Namespace) -> ListenerLimits:
    return ListenerLimits(max_connections=args.max_connections, max_pending=args.max_pending,
                          handshake_timeout_s=args.handshake_timeout)


def checkpoint_mode(args: argparse.Namespace) -> str:
    if args.aligned_timeout is not None:
        if args.checkpoint_mode != "aligned":
            raise ValueError("--aligned-timeout applies to --checkpoint-mode aligned only")
        return "aligned_timeout"
    return str(args.checkpoint_mode).replace("-", "_")


def _job_config(args: argparse.Namespace) -> dict[str, Any]:
    return {"buffer_bytes": args.buffer_bytes, "buffers_per_channel": args.buffers_per_channel,
            "exclusive_credits": args.exclusive_credits, "floating_credits": args.floating_credits,
            "flush_timeout_s": args.flush_timeout, "inflight_target_s": args.inflight_target,
            "incremental_channel_state": args.incremental_channel_state,
            "checkpoint": {"interval_s": args.checkpoint_interval, "mode": checkpoint_mode(args),
                           "aligned_timeout_s": args.aligned_timeout, "timeout_s": args.checkpoint_timeout,
                           "min_pause_s": args.min_pause, "tolerable_failures": args.tolerable_failures,
                           "retain": args.retain, **_switch_config(args)},
            "restart": _restart_config(args),
            **({"parallelism": dict(args.parallelism)} if args.parallelism else {}),
            **_state_config(args),
            **_async_state_config(args),
            **({"scale_down_after_s": args.scale_down_after} if args.scale_down_after is not None else {}),
            **({"allow_non_restored_state": True} if getattr(args, "allow_non_restored_state", False) else {})}


def _switch_config(args: argparse.Namespace) -> dict[str, Any]:
    """Per-channel switching, the in-flight cap and concurrency: only the ones given (CheckpointSettings)."""
    given = {"channel_timeout_s": args.channel_timeout, "channel_inflight_bytes": args.channel_inflight,
             "max_inflight_bytes": args.max_inflight,
             "max_concurrent": args.max_concurrent if args.max_concurrent != 1 else None}
    return {k: v for k, v in given.items() if v is not None}


def _restart_config(args: argparse.Namespace) -> dict[str, Any]:
    """The restart settings given; the others are the strategy's defaults (coordinator/restarts.py)."""
    given = {"kind": args.restart_strategy, "max_attempts": args.restart_attempts, "delay_s": args.restart_delay,
             "failure_window_s": args.restart_window}
    return {k: (None if v == "life" else v) for k, v in given.items() if v is not None}


def _state_config(args: argparse.Namespace) -> dict[str, Any]:
    """The job's "state" settings; absent when none was given, so the job module's default applies."""
    if args.state_backend == state_registry.REMOTE and not args.state_remote_address:
        raise ValueError("--state-backend remote needs --state-remote-address HOST:PORT")
    state = {k: v for k, v in (("backend", args.state_backend), ("remote_address", args.state_remote_address),
                               ("work_dir", os.path.abspath(args.state_work_dir) if args.state_work_dir else None))
             if v is not None}
    return {"state": state} if state else {}


def _async_state_config(args: argparse.Namespace) -> dict[str, Any]:
    """The job's "async_state" settings given on the command line; absent when none was (defaults apply)."""
    given = {"max_in_flight": args.async_max_in_flight, "batch_size": args.async_batch_size,
             "batch_timeout_ms": args.async_batch_timeout * 1000 if args.async_batch_timeout is not None else None,
             "key_order": args.async_key_order, "epochs": args.async_epochs, "checkpoint": args.async_checkpoint}
    settings = {k: v for k, v in given.items() if v is not None}
    if settings:
        AsyncStateSettings.from_config(settings)  # refuse a bad combination here, not on every worker
    return {"async_state": settings} if settings else {}


def _address_text(text: str) -> str:
    host, port = _address(text)
    return f"{host}:{port}"


def _parallelism(text: str) -> tuple[str, int]:
    name, sep, value = text.rpartition("=")
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or (sep and not name):
        raise argparse.ArgumentTypeError(f"expected N or NAME=N with N a positive integer, got {text!r}")
    return (name if sep else "*"), n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Streaming dataflow runtime with fast checkpoints.")
    parser.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("coordinator", help="run the coordinator process")
    _add_address_options(c, "RPC and metrics ports", "the host name")
    c.add_argument("--port", type=_port, default=6123, help="RPC port (0 picks a free one)")
    c.add_argument("--metrics-port", type=_port, default=0, help="Prometheus port (0 picks a free one)")
    c.add_argument("--no-metrics", action="store_true")
    c.add_argument("--http-port", type=_port, default=0, help="REST API and web UI port (0 picks a free one)")
    c.add_argument("--no-http", action="store_true")
    c.add_argument("--state-dir", default="./sluice-state")
    c.add_argument("--checkpoint-dir", type=_storage_path, metavar="PATH|s3://BUCKET/PREFIX",
                   help="where checkpoints (and by default savepoints) go: a shared directory or an S3-compatible "
                        "bucket, configured by the AWS_* environment variables (default: --state-dir)")
    c.add_argument("--heartbeat-timeout", type=_duration, default=10.0)
    c.add_argument("--token-file")
    c.add_argument("--standby", action="store_true",
                   help="wait as a standby until the leader of --state-dir (shared) fails, then take over its jobs")
    c.add_argument("--lease-timeout", type=_duration, default=5.0,
                   help="a leader that has not renewed its lease for this long is taken over (5s)")
    a = c.add_argument_group("scaling down when workers are lost, and back up when they return")
    a.add_argument("--scale-down-after", type=_scale_down_after, default=10.0, metavar="DURATION|never",
                   help="a restart that waited this long for enough slots restarts the job at the largest "
                        "parallelism the free slots allow (default 10s; 0 or never: wait, then fail); a job's "
                        "own --scale-down-after wins")
    a.add_argument("--scale-up-after", type=_duration_or_zero, default=5.0, metavar="DURATION",
                   help="a scaled-down job is rescaled back up once new workers have stayed registered this "
                        "long (default 5s)")
    _add_listener_options(c, "RPC")
    _add_tls_options(c, listens=True)
    t = c.add_argument_group("trust (what a token holder may make the coordinator touch)")
    t.add_argument("--allowed-job-path", action="append", default=[], metavar="DIR",
                   help="a directory job modules may be imported from (repeatable; default: the working directory)")
    t.add_argument("--savepoint-root", action="append", default=[], metavar="DIR",
                   help="a directory savepoints may be written under (repeatable; default: STATE_DIR/savepoints)")

    w = sub.add_parser("worker", help="run a worker process")
    w.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    w.add_argument("--slots", type=_positive, default=2)
    _add_address_options(w, "data and metrics ports", "the address facing the coordinator")
    w.add_argument("--data-port", type=_port, default=0)
    w.add_argument("--metrics-port", type=_port, default=0)
    w.add_argument("--no-metrics", action="store_true")
    w.add_argument("--id", default="", help="worker id (default: host, pid and a random suffix)")
    w.add_argument("--heartbeat-interval", type=_duration, default=1.0)
    w.add_argument("--link-timeout", type=_duration_or_zero, default=10.0,
                   help="close a data link silent this long and fail its tasks (default 10s; 0 disables)")
    w.add_argument("--token-file")
    _add_listener_options(w, "data")
    _add_tls_options(w, listens=True)

    s = sub.add_parser("submit", help="submit a job to a running coordinator")
    s.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    s.add_argument("entry", metavar="MODULE:FUNCTION", nargs="?")
    s.add_argument("--sql", metavar="FILE.sql", help="submit a Flink SQL script instead of a job module")
    s.add_argument("--wait", action="store_true", help="wait for the job to end; exit non-zero unless it FINISHED")
    s.add_argument("--wait-timeout", type=_duration, default=None, metavar="DURATION",
                   help="with --wait: give up after this long (exit 1, the job keeps running); default: no limit")
    s.add_argument("--token-file")
    _add_job_options(s)

    st = sub.add_parser("status", help="show workers and jobs, or one job in detail")
    st.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    st.add_argument("job_id", nargs="?")
    st.add_argument("--json", action="store_true")
    st.add_argument("--token-file")

    ca = sub.add_parser("cancel", help="cancel a job")
    ca.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    ca.add_argument("job_id")
    ca.add_argument("--token-file")

    cp = sub.add_parser("checkpoint", help="take a checkpoint of a running job now and wait for it")
    cp.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    cp.add_argument("job_id")
    cp.add_argument("--mode", choices=["aligned", "unaligned", "at-least-once"], help="override the job's mode")
    cp.add_argument("--token-file")

    sp = sub.add_parser("savepoint", help="take an aligned, self-contained savepoint of a running job")
    sp.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    sp.add_argument("job_id")
    sp.add_argument("--dir", help="directory to write it under, inside one of the coordinator's --savepoint-root "
                    "(default: the first root)")
    sp.add_argument("--token-file")

    rs = sub.add_parser("rescale", help="rescale a running job through a checkpoint of its mode; print the downtime")
    rs.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    rs.add_argument("job_id")
    rs.add_argument("--parallelism", metavar="N|NAME=N", type=_parallelism, action="append", required=True,
                    help="every operator (N) or the one named NAME (NAME=N, repeatable) at this parallelism")
    rs.add_argument("--timeout", type=_duration, default=600.0, help="give up waiting after (600s)")
    rs.add_argument("--token-file")

    up = sub.add_parser("upgrade", help="stop a running job with a savepoint and start a new version of it from "
                        "that savepoint; print the downtime (README: Evolving a job)")
    up.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    up.add_argument("job_id")
    up.add_argument("entry", help="the new version, package.module:function (imported from this directory)")
    up.add_argument("--parallelism", metavar="N|NAME=N", type=_parallelism, action="append", default=[],
                    help="as in rescale; default: the running job's")
    up.add_argument("--allow-non-restored-state", action="store_true",
                    help="drop the state of operators (by uid) the new version no longer has")
    up.add_argument("--dir", help="where the savepoint goes, inside one of the coordinator's --savepoint-root "
                    "(default: the first root)")
    up.add_argument("--name", help="the new job's name (default: the running job's)")
    up.add_argument("--timeout", type=_duration, default=600.0, help="give up waiting after (600s)")
    up.add_argument("--token-file")

    cl = sub.add_parser("checkpoints", help="list a job's recent checkpoints with their figures")
    cl.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    cl.add_argument("job_id")
    cl.add_argument("--json", action="store_true")
    cl.add_argument("--token-file")

    pr = sub.add_parser("probe", help="send a probe through a running job on the priority lane and time it")
    pr.add_argument("--coordinator", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    pr.add_argument("job_id")
    pr.add_argument("--token-file")

    lo = sub.add_parser("local", help="run a job on a local multi-process cluster")
    lo.add_argument("entry", metavar="MODULE:FUNCTION")
    lo.add_argument("--workers", type=_positive, default=2)
    lo.add_argument("--slots", type=_positive, default=2)
    lo.add_argument("--metrics-port-base", type=_port, default=0,
                    help="coordinator metrics on BASE, worker i on BASE+i (default: free ports, printed)")
    lo.add_argument("--state-dir", help="coordinator state and the cluster token (default: in the log directory)")
    lo.add_argument("--keep-logs", action="store_true", help="keep the log directory at exit (default: removed)")
    lo.add_argument("--keep-running", action="store_true",
                    help="keep the cluster and its web UI up after the job ends, until Ctrl-C or SIGTERM")
    lo.add_argument("--no-restart-workers", action="store_true",
                    help="do not start a worker process again when it dies")
    lo.add_argument("--link-timeout", type=_duration_or_zero, default=10.0,
                    help="workers close a data link silent this long and fail its tasks (default 10s; 0 disables)")
    _add_job_options(lo)
    _add_tls_options(lo, listens=True)

    from runtime.cli.sql_command import add_sql_parser  # `sluice sql` (runtime/cli/sql_command.py)

    add_sql_parser(sub, _add_job_options, _add_tls_options, _port, _positive, _duration_or_zero)

    d = sub.add_parser("demo", help="the word count under backpressure on a local cluster")
    d.add_argument("--records", type=_positive, default=400_000)
    d.add_argument("--dir", default=".demo", help="where the demo writes its output (default .demo)")

    # The batch side on Spark (runtime/data): needs Java 17 and PySpark, checked only when these run.
    da = sub.add_parser("data", help="Spark jobs: generate input data sets, verify committed outputs")
    dsub = da.add_subparsers(dest="data_command", required=True)
    dg = dsub.add_parser("generate", help="write a deterministic Parquet data set of (key, seq, event_time_ms)")
    dg.add_argument("out", metavar="OUT", help="output directory (replaced if it holds an earlier data set)")
    dg.add_argument("--rows", type=_positive, required=True)
    dg.add_argument("--keys", type=_positive, required=True)
    dg.add_argument("--skew", choices=["uniform", "zipf"], default="uniform")
    dg.add_argument("--zipf-exponent", type=float, default=1.1)
    dg.add_argument("--partitions", type=_positive, default=4, help="output files (default 4)")
    dg.add_argument("--row-group-rows", type=_positive, help="rows per row group (default: about 8 groups a file)")
    dg.add_argument("--seed", type=int, default=0)
    dg.add_argument("--jitter-ms", type=int, default=0,
                    help="out-of-order event times: each row's is up to this much behind 1_700_000_000_000 + seq, "
                         "deterministically for the seed (default 0: in order)")
    dg.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    dv = dsub.add_parser("verify", help="compare a job's committed output with the query computed by Spark")
    dv.add_argument("--input", required=True, help="the job's Parquet input")
    dv.add_argument("--output", required=True, help="the job's FileSink directory")
    dv.add_argument("--query", choices=["wordcount", "window-count", "session-count", "interval-join", "window-join"],
                    default="wordcount")
    dv.add_argument("--right-input", help="interval-join, window-join: the second (right) Parquet input")
    dv.add_argument("--lower-ms", type=int, help="interval-join: lower bound of right time - left time (inclusive)")
    dv.add_argument("--upper-ms", type=int, help="interval-join: upper bound of right time - left time (inclusive)")
    dv.add_argument("--window-ms", type=_positive, help="window-count, window-join: window size")
    dv.add_argument("--slide-ms", type=_positive, help="window-count: slide of sliding windows (default: tumbling)")
    dv.add_argument("--max-delay-ms", type=int, default=0,
                    help="window-count, session-count: the source's bounded out-of-orderness (default 0)")
    dv.add_argument("--allowed-lateness-ms", type=int, default=0, help="window-count (default 0)")
    dv.add_argument("--gap-ms", type=_positive, help="session-count: session gap")
    dv.add_argument("--late-output", metavar="DIR",
                    help="window-count, session-count: also verify the late records' FileSink directory")
    dv.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    dv.add_argument("--json", action="store_true", help="print the result as JSON")
    from runtime.data.state_commands import add_state_parser  # the state processor (issue 21)

    add_state_parser(dsub)
    from runtime.data.nexmark import add_nexmark_parser  # the Nexmark tables (issue 28)

    add_nexmark_parser(dsub)
    for client in (s, st, ca, cp, sp, rs, up, cl, pr):
        client.add_argument("--state-dir", help="read the cluster token from STATE_DIR/token (what `sluice local` "
                                                "writes and prints)")
        _add_tls_options(client, listens=False)
    return parser


def _client_call(args: argparse.Namespace, method: str, payload: dict[str, Any], timeout_s: float = 30.0) -> Any:
    from runtime.cli.client import call_leader

    return run(call_leader(args.coordinator, _client_token(args), method, payload, tls=_tls(args),
                           timeout_s=timeout_s))


def _client_token(args: argparse.Namespace) -> str:
    if args.token_file is None and args.state_dir is not None:
        return load_token(os.path.join(args.state_dir, "token"))
    return load_token(args.token_file)


def _print_job(summary: dict[str, Any]) -> None:
    print(f"job {summary['job_id']}  {summary['state']}  ({summary['name']})")
    if summary.get("error"):
        print(f"  error: {summary['error']}")
    print(f"  tasks finished {summary['tasks_finished']}/{summary['tasks_total']}")
    if summary.get("final_checkpoint_id") is not None:
        print(f"  final checkpoint {summary['final_checkpoint_id']}")
    for v in summary.get("vertices", []):
        asked = v.get("asked_parallelism", v["parallelism"])
        print(f"  {v['name']:<40} parallelism {v['parallelism']}" + (f" (asked {asked})" if asked != v["parallelism"]
                                                                       else ""))
    if (summary.get("scaling") or {}).get("reason"):
        print(f"  {summary['scaling']['reason']}")
    for t in summary["tasks"]:
        print(f"  {t['task']:<22} {t['state']:<9} in {t['records_in']:>12,} out {t['records_out']:>12,} "
              f"busy {t['busy_s']:7.1f}s idle {t['idle_s']:7.1f}s backpressured {t['backpressured_s']:7.1f}s "
              f"on {t.get('worker', '?')}")


def coordinator_config(args: argparse.Namespace) -> CoordinatorConfig:
    """The coordinator's configuration from `sluice coordinator ...` arguments."""
    from coordinator.autoscale import AutoscaleSettings
    from coordinator.server import CoordinatorConfig

    return CoordinatorConfig(token=load_token(args.token_file), host=args.host, port=args.port,
                             metrics_port=None if args.no_metrics else args.metrics_port,
                             http_port=None if args.no_http else args.http_port,
                             state_dir=args.state_dir, heartbeat_timeout_s=args.heartbeat_timeout,
                             allowed_job_paths=tuple(os.path.abspath(p) for p in args.allowed_job_path),
                             savepoint_roots=tuple(objectstore.absolute(p) for p in args.savepoint_root),
                             advertise=args.advertise or "", checkpoint_dir=args.checkpoint_dir or "",
                             limits=_listener_limits(args), tls=_tls(args), standby=args.standby,
                             lease_s=args.lease_timeout,
                             autoscale=AutoscaleSettings(args.scale_down_after, args.scale_up_after))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_nofile_limit()  # every socket counts against it; the usual soft 1024 is too few for a busy port
    try:
        return _dispatch(args)
    except ValueError as exc:  # configuration errors found after parsing (token file...)
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:  # the coordinator refused: its reason, and a status saying which kind of refusal
        from runtime.cli.client import refusal
        status, line = refusal(exc)
        print(f"sluice {args.command}: {line}", file=sys.stderr)
        return status
    except NetstackError as exc:
        print(f"sluice {args.command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        reason = _listen_failure(args, exc)
        if reason is None:
            raise
        print(f"sluice {args.command}: {reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "coordinator":
        from coordinator.server import run_coordinator

        run(run_coordinator(coordinator_config(args)))
        return 0
    if args.command == "worker":
        from runtime.worker.worker import WorkerConfig, run_worker

        host, port = args.coordinator[0]
        wconfig = WorkerConfig(coordinator_host=host, coordinator_port=port, coordinator_addresses=args.coordinator,
                               token=load_token(args.token_file),
                               slots=args.slots, host=args.host, advertise=args.advertise or "",
                               data_port=args.data_port,
                               metrics_port=None if args.no_metrics else args.metrics_port, worker_id=args.id,
                               heartbeat_interval_s=args.heartbeat_interval, limits=_listener_limits(args),
                               tls=_tls(args), link_timeout_s=args.link_timeout)
        run(run_worker(wconfig))
        return 0
    if args.command == "submit":
        if (args.sql is None) == (args.entry is None):
            print("sluice submit: give a job entry MODULE:FUNCTION or --sql FILE.sql", file=sys.stderr)
            return 2
        if args.sql is not None:
            from runtime.cli.sql_command import prepare

            problem = prepare(args, args.parser, "submit")
            if problem:
                print(f"sluice submit: {problem}", file=sys.stderr)
                return 2
        result = _client_call(args, "submit", {"entry": args.entry, "name": args.name, "config": _job_config(args),
                                               "sys_path": os.getcwd(), "restore": _abs(args.restore)})
        print(f"submitted {result['job_id']} ({result['tasks']} tasks)")
        if not args.wait:
            return 0
        return _wait_for(args, result["job_id"])
    if args.command == "status":
        result = _client_call(args, "status", {"job_id": args.job_id} if args.job_id else {})
        if args.json:
            print(json.dumps(result, indent=2))
        elif args.job_id:
            _print_job(result)
        else:
            if "coordinator" in result:
                c = result["coordinator"]
                print(f"coordinator {c['id']}  lease epoch {c['epoch']}  recovered jobs {c['recovered_jobs']}")
            print(f"workers: {len(result['workers'])}")
            for w in result["workers"]:
                print(f"  {w['id']:<24} slots {w['slots']}  data {w['data']}  metrics {w['metrics_port']}")
            print(f"jobs: {len(result['jobs'])}")
            for j in result["jobs"]:
                err = f"  ({j['error']})" if j["error"] else ""
                print(f"  {j['job_id']}  {j['state']:<10} {j['name']}{err}")
        return 0
    if args.command == "cancel":
        result = _client_call(args, "cancel", {"job_id": args.job_id})
        print(f"job {args.job_id}: {result['state']}")
        return 0
    if args.command in ("checkpoint", "savepoint"):
        payload: dict[str, Any] = {"job_id": args.job_id}
        if args.command == "savepoint":
            payload.update(savepoint=True, directory=_abs(args.dir))
        elif args.mode:
            payload["mode"] = args.mode.replace("-", "_")
        result = _client_call(args, "checkpoint", payload)
        if result["status"] == "COMPLETED":
            print(f"{args.command} {result['checkpoint_id']} completed: {result['path']}")
            return 0
        print(f"{args.command} {result['checkpoint_id']} aborted: {result.get('reason', '')}", file=sys.stderr)
        return 1
    if args.command == "rescale":
        result = _client_call(args, "rescale", {"job_id": args.job_id, "parallelism": dict(args.parallelism),
                                                "timeout_s": args.timeout}, timeout_s=args.timeout + 60.0)
        inflight = f", {result['inflight_bytes']:,} bytes in flight" if result.get("inflight_bytes") else ""
        shape = ", ".join(f"{v['name']}={v['parallelism']}" for v in result["vertices"])
        print(f"job {result['job_id']} rescaled to {shape} (attempt {result['attempt']}) from checkpoint "
              f"{result['checkpoint_id']}{inflight}: downtime {result['downtime_s']:.3f}s")
        return 0
    if args.command == "upgrade":
        result = _client_call(args, "upgrade", {
            "job_id": args.job_id, "entry": args.entry, "name": args.name, "sys_path": os.getcwd(),
            "parallelism": dict(args.parallelism), "allow_non_restored_state": args.allow_non_restored_state,
            "directory": _abs(args.dir), "timeout_s": args.timeout}, timeout_s=args.timeout + 60.0)
        shape = ", ".join(f"{v['name']}={v['parallelism']}" for v in result["vertices"])
        print(f"job {result['previous_job_id']} upgraded to {result['job_id']} ({shape}) from savepoint "
              f"{result['savepoint']} (taken in {result['savepoint_s']:.3f}s): downtime {result['downtime_s']:.3f}s")
        return 0
    if args.command == "checkpoints":
        result = _client_call(args, "checkpoints", {"job_id": args.job_id})
        if args.json:
            print(json.dumps(result, indent=2))
            return 0
        print(f"{'id':>5} {'status':<11} {'mode':<15} {'duration':>9} {'alignment':>9} {'state':>10} "
              f"{'in-flight':>10}  note")
        for h in result["history"]:
            duration = f"{h['duration_s']:.3f}s" if h["duration_s"] is not None else "-"
            kind = "savepoint " if h["savepoint"] else ""
            switched = h.get("switched_channels") or 0  # per-channel switching: channels switched to unaligned
            kind += f"switched {switched} channels " if switched else ""
            print(f"{h['checkpoint_id']:>5} {h['status']:<11} {h['mode']:<15} {duration:>9} "
                  f"{h['alignment_s']:>8.3f}s {h['state_bytes']:>10,} {h['inflight_bytes']:>10,}  "
                  f"{kind}{h['failure_reason']}")
        for r in result["retained"]:
            print(f"retained: chk-{r['checkpoint_id']} {r['path']}")
        return 0
    if args.command == "probe":
        result = _client_call(args, "probe", {"job_id": args.job_id})
        state = "crossed" if result["complete"] else "did NOT cross"
        print(f"probe {result['probe_id']} {state} the job: {len(result['tasks'])}/{result['tasks_total']} tasks, "
              f"{(result['duration_s'] or 0) * 1000:.1f} ms")
        for r in result["tasks"]:
            print(f"  {r['task']:<24} at {r['arrival_s'] * 1000:8.1f} ms  overtook {r['overtaken_output_buffers']} "
                  f"output and {r['overtaken_input_buffers']} input buffers")
        return 0 if result["complete"] else 1
    if args.command == "sql":
        from runtime.cli.sql_command import run_sql

        status = run_sql(args, args.parser)  # None: the script is planned, run it as `local` runs a job
        if status is not None:
            return status
    if args.command in ("local", "sql"):
        from runtime.cli.local_cluster import run_local

        return run_local(args.entry, workers=args.workers, slots=args.slots, config=_job_config(args),
                         metrics_port_base=args.metrics_port_base or None, state_dir=args.state_dir, name=args.name,
                         restore=_abs(args.restore), restart_workers=not args.no_restart_workers,
                         keep_logs=args.keep_logs, tls=_tls_absolute(args), link_timeout_s=args.link_timeout,
                         keep_running=args.keep_running)
    if args.command == "demo":
        from runtime.cli.demo import run_demo

        return run_demo(records=args.records, directory=args.dir)
    if args.command == "data":
        from runtime.data.commands import run as run_data

        return run_data(args)
    raise AssertionError(args.command)


def _listen_failure(args: argparse.Namespace, exc: OSError) -> str | None:
    """One line naming the port a coordinator or worker could not listen on, or None for other errors.

    Each process binds its own port first (RPC or data, through asyncio, whose error names the address),
    then the metrics port (whose error names none), so the message tells the two apart.
    """
    if args.command not in ("coordinator", "worker") or exc.errno not in (errno.EADDRINUSE, errno.EACCES,
                                                                           errno.EADDRNOTAVAIL):
        return None
    own_flag, own_port = ("--port", args.port) if args.command == "coordinator" else ("--data-port", args.data_port)
    if re.search(rf"\(\'[^']*\', {own_port}\)", str(exc)) or args.no_metrics:
        flag, port = own_flag, own_port
    elif args.command == "coordinator" and args.http_port and re.search(rf"\(\'[^']*\', {args.http_port}\)", str(exc)):
        flag, port = "--http-port", args.http_port
    else:
        flag, port = "--metrics-port", args.metrics_port
    what = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be used: {os.strerror(exc.errno)}"
    return f"cannot listen on {args.host}:{port} ({flag}): the port {what}"


def _tls_absolute(args: argparse.Namespace) -> TlsFiles | None:
    """For child processes, which may start elsewhere; checked here so a bad file is one line, not a child's."""
    tls = TlsFiles.from_options(_abs(args.tls_cert), _abs(args.tls_key), _abs(args.tls_ca))
    if tls is not None:
        server_context(tls)
        client_context(tls)
    return tls


def _abs(path: str | None) -> str | None:
    """A local path made absolute (the coordinator has another working directory); an s3:// URL as it is."""
    return objectstore.absolute(path) if path else None


def _wait_for(args: argparse.Namespace, job_id: str) -> int:
    from runtime.cli.client import JOB_ENDED, wait_job_on_leader

    summary = run(wait_job_on_leader(args.coordinator, _client_token(args), job_id, timeout_s=args.wait_timeout,
                                     tls=_tls(args)))
    _print_job(summary)
    if summary["state"] not in JOB_ENDED:
        print(f"sluice submit: job {job_id} is still {summary['state']} after --wait-timeout "
              f"{args.wait_timeout:g}s", file=sys.stderr)
    return 0 if summary["state"] == "FINISHED" else 1


if __name__ == "__main__":
    sys.exit(main())
