"""The commands that run on this machine: `sluice local` (a cluster of processes for one job), `sluice demo`
and `sluice data` (the batch side on Spark)."""

from __future__ import annotations

import argparse

from netstack.tls import TlsFiles, client_context, server_context
from runtime.cli import arguments as a
from runtime.cli.command import Command
from runtime.cli.job_options import add_job_options, job_config


def _local_arguments(lo: argparse.ArgumentParser) -> None:
    lo.add_argument("entry", metavar="MODULE:FUNCTION")
    add_local_cluster_options(lo)


def add_local_cluster_options(lo: argparse.ArgumentParser) -> None:
    """The flags of a run on a local cluster, declared once for `sluice local` and `sluice sql`."""
    lo.add_argument("--workers", type=a.positive, default=2)
    lo.add_argument("--slots", type=a.positive, default=2)
    lo.add_argument("--metrics-port-base", type=a.port, default=0,
                    help="coordinator metrics on BASE, worker i on BASE+i (default: free ports, printed)")
    lo.add_argument("--state-dir", help="coordinator state and the cluster token (default: in the log directory)")
    lo.add_argument("--keep-logs", action="store_true", help="keep the log directory at exit (default: removed)")
    lo.add_argument("--keep-running", action="store_true",
                    help="keep the cluster and its web UI up after the job ends, until Ctrl-C or SIGTERM")
    lo.add_argument("--no-restart-workers", action="store_true",
                    help="do not start a worker process again when it dies")
    lo.add_argument("--link-timeout", type=a.duration_or_zero, default=10.0,
                    help="workers close a data link silent this long and fail its tasks (default 10s; 0 disables)")
    add_job_options(lo)
    a.add_tls_options(lo, listens=True)


def run_local(args: argparse.Namespace) -> int:
    from runtime.cli.local_cluster import run_local as run_cluster

    return run_cluster(args.entry, workers=args.workers, slots=args.slots, config=job_config(args),
                       metrics_port_base=args.metrics_port_base or None, state_dir=args.state_dir, name=args.name,
                       restore=a.absolute(args.restore), restart_workers=not args.no_restart_workers,
                       keep_logs=args.keep_logs, tls=_tls_absolute(args), link_timeout_s=args.link_timeout,
                       keep_running=args.keep_running)


def _tls_absolute(args: argparse.Namespace) -> TlsFiles | None:
    """For child processes, which may start elsewhere; checked here so a bad file is one line, not a child's."""
    tls = TlsFiles.from_options(a.absolute(args.tls_cert), a.absolute(args.tls_key), a.absolute(args.tls_ca))
    if tls is not None:
        server_context(tls)
        client_context(tls)
    return tls


def _demo_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("--records", type=a.positive, default=None,
                   help="input records (default 400000; 40000 with --kafka)")
    d.add_argument("--dir", default=".demo", help="where the demo writes its output (default .demo)")
    d.add_argument("--kafka", metavar="HOST:PORT", default=None,
                   help="run over the Kafka broker at HOST:PORT: topics in and out, KafkaSink exactly once, no "
                        "Spark (the `kafka` extra)")


def run_demo(args: argparse.Namespace) -> int:
    from runtime.cli.demo import run_demo as demo

    return demo(records=args.records, directory=args.dir, kafka=args.kafka)


def _data_arguments(da: argparse.ArgumentParser) -> None:
    """The batch side on Spark (runtime/data): needs Java 17 and PySpark, checked only when these run."""
    dsub = da.add_subparsers(dest="data_command", required=True)
    dg = dsub.add_parser("generate", help="write a deterministic Parquet data set of (key, seq, event_time_ms)")
    dg.add_argument("out", metavar="OUT", help="output directory (replaced if it holds an earlier data set)")
    dg.add_argument("--rows", type=a.positive, required=True)
    dg.add_argument("--keys", type=a.positive, required=True)
    dg.add_argument("--skew", choices=["uniform", "zipf"], default="uniform")
    dg.add_argument("--zipf-exponent", type=float, default=1.1)
    dg.add_argument("--partitions", type=a.positive, default=4, help="output files (default 4)")
    dg.add_argument("--row-group-rows", type=a.positive, help="rows per row group (default: about 8 groups a file)")
    dg.add_argument("--seed", type=int, default=0)
    dg.add_argument("--jitter-ms", type=int, default=0,
                    help="out-of-order event times: each row's is up to this much behind 1_700_000_000_000 + seq, "
                         "deterministically for the seed (default 0: in order)")
    dg.add_argument("--master", default="local[2]",
                    help="Spark master (default local[2]; sc://HOST:PORT: a running Spark Connect server)")
    dv = dsub.add_parser("verify", help="compare a job's committed output with the query computed by Spark")
    dv.add_argument("--input", required=True, help="the job's Parquet input")
    dv.add_argument("--output", required=True, help="the job's FileSink directory, or its table: a Delta table's "
                                                    "path or s3:// URL, an Iceberg table's namespace.table")
    dv.add_argument("--output-format", choices=["files", "delta", "iceberg"], default="files",
                    help="what --output is (default files: a FileSink's part files); tables are read through Arrow")
    dv.add_argument("--catalog", help="--output-format iceberg: pyiceberg catalog properties as JSON, e.g. "
                                      "'{\"type\": \"sql\", \"uri\": \"sqlite:///cat.db\", \"warehouse\": \"file:///wh\"}'")
    dv.add_argument("--query", choices=["wordcount", "window-count", "session-count", "interval-join", "window-join"],
                    default="wordcount")
    dv.add_argument("--right-input", help="interval-join, window-join: the second (right) Parquet input")
    dv.add_argument("--lower-ms", type=int, help="interval-join: lower bound of right time - left time (inclusive)")
    dv.add_argument("--upper-ms", type=int, help="interval-join: upper bound of right time - left time (inclusive)")
    dv.add_argument("--window-ms", type=a.positive, help="window-count, window-join: window size")
    dv.add_argument("--slide-ms", type=a.positive, help="window-count: slide of sliding windows (default: tumbling)")
    dv.add_argument("--max-delay-ms", type=int, default=0,
                    help="window-count, session-count: the source's bounded out-of-orderness (default 0)")
    dv.add_argument("--allowed-lateness-ms", type=int, default=0, help="window-count (default 0)")
    dv.add_argument("--gap-ms", type=a.positive, help="session-count: session gap")
    dv.add_argument("--late-output", metavar="DIR",
                    help="window-count, session-count: also verify the late records' FileSink directory")
    dv.add_argument("--master", default="local[2]",
                    help="Spark master (default local[2]; sc://HOST:PORT: a running Spark Connect server)")
    dv.add_argument("--json", action="store_true", help="print the result as JSON")
    from runtime.data.state_commands import add_state_parser  # the state processor (issue 21)

    add_state_parser(dsub)
    from runtime.data.nexmark import add_nexmark_parser  # the Nexmark tables (issue 28)

    add_nexmark_parser(dsub)


def run_data(args: argparse.Namespace) -> int:
    from runtime.data.commands import run

    return run(args)


COMMANDS = (
    Command("local", "run a job on a local multi-process cluster", _local_arguments, run_local),
    Command("demo", "the word count under backpressure on a local cluster", _demo_arguments, run_demo),
    Command("data", "Spark jobs: generate input data sets, verify committed outputs", _data_arguments, run_data),
)
