"""The commands that run a long-lived process: `sluice coordinator` and `sluice worker`."""

from __future__ import annotations

import argparse
import errno
import os
import re
from typing import TYPE_CHECKING

from netstack.transport import run
from runtime.cli import arguments as a
from runtime.cli.command import Command
from runtime.common import objectstore
from runtime.graph.config import load_token

if TYPE_CHECKING:
    from coordinator.server import CoordinatorConfig


def _coordinator_arguments(c: argparse.ArgumentParser) -> None:
    a.add_address_options(c, "RPC and metrics ports", "the host name")
    c.add_argument("--port", type=a.port, default=6123, help="RPC port (0 picks a free one)")
    c.add_argument("--metrics-port", type=a.port, default=0, help="Prometheus port (0 picks a free one)")
    c.add_argument("--no-metrics", action="store_true")
    c.add_argument("--http-port", type=a.port, default=0, help="REST API and web UI port (0 picks a free one)")
    c.add_argument("--no-http", action="store_true")
    c.add_argument("--state-dir", default="./sluice-state")
    c.add_argument("--checkpoint-dir", type=a.storage_path, metavar="PATH|s3://BUCKET/PREFIX",
                   help="where checkpoints (and by default savepoints) go: a shared directory or an S3-compatible "
                        "bucket, configured by the AWS_* environment variables (default: --state-dir)")
    c.add_argument("--heartbeat-timeout", type=a.duration, default=10.0)
    c.add_argument("--token-file")
    c.add_argument("--standby", action="store_true",
                   help="wait as a standby until the leader of --state-dir (shared) fails, then take over its jobs")
    c.add_argument("--lease-timeout", type=a.duration, default=15.0,
                   help="a leader that has not renewed its lease for this long is taken over (15s)")
    g = c.add_argument_group("scaling down when workers are lost, and back up when they return")
    g.add_argument("--scale-down-after", type=a.never_or_duration, default=10.0, metavar="DURATION|never",
                   help="a restart that waited this long for enough slots restarts the job at the largest "
                        "parallelism the free slots allow (default 10s; 0 or never: wait, then fail); a job's "
                        "own --scale-down-after wins")
    g.add_argument("--scale-up-after", type=a.duration_or_zero, default=5.0, metavar="DURATION",
                   help="a scaled-down job is rescaled back up once new workers have stayed registered this "
                        "long (default 5s)")
    a.add_listener_options(c, "RPC")
    a.add_tls_options(c, listens=True)
    o = c.add_argument_group("OpenTelemetry (off unless a collector is named)")
    o.add_argument("--otlp-endpoint", metavar="URL",
                   help="export traces of checkpoints and recoveries and the metrics over OTLP/HTTP to the collector "
                        "at URL (http://host:4318; /v1/traces and /v1/metrics are added); default: "
                        "OTEL_EXPORTER_OTLP_ENDPOINT when set")
    o.add_argument("--otlp-interval", type=a.duration, default=10.0, metavar="DURATION",
                   help="metrics are exported this often (default 10s)")
    t = c.add_argument_group("trust (what a token holder may make the coordinator touch)")
    t.add_argument("--allowed-job-path", action="append", default=[], metavar="DIR",
                   help="a directory job modules may be imported from (repeatable; default: the working directory)")
    t.add_argument("--savepoint-root", action="append", default=[], metavar="DIR",
                   help="a directory savepoints may be written under (repeatable; default: STATE_DIR/savepoints)")


def coordinator_config(args: argparse.Namespace) -> CoordinatorConfig:
    """The coordinator's configuration from `sluice coordinator ...` arguments."""
    from coordinator.autoscale import AutoscaleSettings
    from coordinator.server import CoordinatorConfig
    from coordinator.telemetry import OtlpSettings

    try:
        otlp = OtlpSettings.from_flags(args.otlp_endpoint, args.otlp_interval)
    except ValueError as exc:  # a URL that is none, from the flag or the environment
        raise SystemExit(f"sluice coordinator: {exc}") from None

    return CoordinatorConfig(token=load_token(args.token_file), host=args.host, port=args.port,
                             metrics_port=None if args.no_metrics else args.metrics_port,
                             http_port=None if args.no_http else args.http_port,
                             state_dir=args.state_dir, heartbeat_timeout_s=args.heartbeat_timeout,
                             allowed_job_paths=tuple(os.path.abspath(p) for p in args.allowed_job_path),
                             savepoint_roots=tuple(objectstore.absolute(p) for p in args.savepoint_root),
                             advertise=args.advertise or "", checkpoint_dir=args.checkpoint_dir or "",
                             limits=a.listener_limits(args), tls=a.tls(args), standby=args.standby,
                             lease_s=args.lease_timeout,
                             autoscale=AutoscaleSettings(args.scale_down_after, args.scale_up_after), otlp=otlp)


def run_coordinator(args: argparse.Namespace) -> int:
    from coordinator.server import run_coordinator as serve

    run(serve(coordinator_config(args)))
    return 0


def _worker_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("--coordinator", type=a.addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]")
    w.add_argument("--slots", type=a.positive, default=2)
    a.add_address_options(w, "data and metrics ports", "the address facing the coordinator")
    w.add_argument("--data-port", type=a.port, default=0)
    w.add_argument("--metrics-port", type=a.port, default=0)
    w.add_argument("--no-metrics", action="store_true")
    w.add_argument("--id", default="", help="worker id (default: host, pid and a random suffix)")
    w.add_argument("--heartbeat-interval", type=a.duration, default=1.0)
    w.add_argument("--link-timeout", type=a.duration_or_zero, default=10.0,
                   help="close a data link silent this long and fail its tasks (default 10s; 0 disables); "
                        "heartbeats wait this long for the coordinator's answer when it is longer than 10s")
    w.add_argument("--slow-call", type=a.duration, default=5.0,
                   help="report a user call running this long: log, metric, the job's exception history "
                        "(default 5s)")
    w.add_argument("--task-cancel-timeout", type=a.duration_or_zero, default=60.0,
                   help="exit (status 70, for the supervisor to restart) when a cancelled task's user call has "
                        "not returned this long after (default 60s; 0: leave the thread behind)")
    w.add_argument("--memory-limit", type=a.byte_size, default=None,
                   help="the worker process's address-space limit (RLIMIT_AS, e.g. 2GiB): a leaking function "
                        "gets MemoryError (default: none)")
    w.add_argument("--token-file")
    a.add_listener_options(w, "data")
    a.add_tls_options(w, listens=True)


def run_worker(args: argparse.Namespace) -> int:
    from runtime.execution.isolation import IsolationSettings
    from runtime.worker.worker import WorkerConfig
    from runtime.worker.worker import run_worker as serve

    host, port = args.coordinator[0]
    config = WorkerConfig(coordinator_host=host, coordinator_port=port, coordinator_addresses=args.coordinator,
                          token=load_token(args.token_file), slots=args.slots, host=args.host,
                          advertise=args.advertise or "", data_port=args.data_port,
                          metrics_port=None if args.no_metrics else args.metrics_port, worker_id=args.id,
                          heartbeat_interval_s=args.heartbeat_interval, limits=a.listener_limits(args),
                          tls=a.tls(args), link_timeout_s=args.link_timeout, slow_call_s=args.slow_call,
                          task_cancel_timeout_s=args.task_cancel_timeout, memory_limit_bytes=args.memory_limit,
                          isolation=IsolationSettings.from_env())
    run(serve(config))
    return 0


def listen_failure(args: argparse.Namespace, exc: OSError) -> str | None:
    """One line naming the port a coordinator or worker could not listen on, or None for other errors.

    Each process binds its own port first (RPC or data, through asyncio, whose error names the address),
    then the metrics port (whose error names none), so the message tells the two apart.
    """
    if exc.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
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


COMMANDS = (
    Command("coordinator", "run the coordinator process", _coordinator_arguments, run_coordinator,
            explain_os_error=listen_failure),
    Command("worker", "run a worker process", _worker_arguments, run_worker, explain_os_error=listen_failure),
)
