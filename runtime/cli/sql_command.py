"""`sluice sql FILE.sql` (run on a local cluster, the flags of `sluice local`), `sluice sql --explain FILE.sql`
(print the plan, start nothing) and `sluice submit --sql FILE.sql` (send it to a coordinator).

The script is parsed and planned here first: bad SQL is one line `FILE:LINE:COLUMN: what` and exit status 2,
with no process started. The job then travels as an entry point carrying the script (runtime/sql/entry.py).
SET keys for checkpoints apply where the command line left the default: an explicit flag wins.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from runtime.cli import arguments as a
from runtime.cli.command import Command
from runtime.cli.local_commands import add_local_cluster_options
from runtime.common import extras


def _sql_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("file", metavar="FILE.sql")
    q.add_argument("--explain", action="store_true", help="print the plan (operators, keys, state, watermarks, "
                                                          "changelog kinds) and start nothing")
    add_local_cluster_options(q)


def load_script(path: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, the one-line problem)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), None
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"


def plan_script(path: str, text: str, *, parallelism: dict[str, int] | None = None) -> tuple[Any, str | None]:
    """Build the job here (nothing starts): (job, None), or (None, 'FILE:LINE:COL: message')."""
    missing = extras.missing(["sql"])
    if missing:
        return None, extras.describe_missing(missing)
    from runtime.api import Job, JobDefinitionError
    from runtime.cli.local_cluster import import_from_working_directory
    from runtime.sql.errors import SqlError

    import_from_working_directory()  # CREATE FUNCTION ... AS 'module.f' is imported while planning
    job = Job(default_name(path))
    try:
        job.sql(text)
    except SqlError as exc:
        where = f"{path}:{exc.line}:{exc.column}" if exc.line is not None else path
        return None, f"{where}: {exc.message}"
    except JobDefinitionError as exc:
        return None, f"{path}: {exc}"
    if not job.nodes:
        return None, f"{path}: the script has no INSERT INTO: nothing to run"
    return job, None


def default_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0] or "sql"


def apply_set_options(args: argparse.Namespace, options: dict[str, str]) -> str | None:
    """SET 'execution.checkpointing.*' onto the checkpoint flags the command line did not give."""
    def untouched(dest: str) -> bool:
        return getattr(args, dest, None) is None

    interval = options.get("execution.checkpointing.interval")
    if interval and untouched("checkpoint_interval"):
        try:
            args.checkpoint_interval = a.duration(interval.replace(" ", ""))
        except (argparse.ArgumentTypeError, ValueError):
            return f"SET 'execution.checkpointing.interval' = '{interval}': a duration expected (e.g. 10s)"
    mode = options.get("execution.checkpointing.mode")
    unaligned = options.get("execution.checkpointing.unaligned.enabled", "").lower() == "true"
    if untouched("checkpoint_mode"):
        if mode and mode.upper() == "AT_LEAST_ONCE":
            args.checkpoint_mode = "at-least-once"
        elif mode and mode.upper() != "EXACTLY_ONCE":
            return f"SET 'execution.checkpointing.mode' = '{mode}': EXACTLY_ONCE or AT_LEAST_ONCE"
        elif unaligned:
            args.checkpoint_mode = "unaligned"
    return None


def prepare(args: argparse.Namespace, path: str) -> str | None:
    """Read and plan the script at `path`: set args.entry, args.name and the SET options; the problem or None."""
    from runtime.sql.entry import entry_for

    text, problem = load_script(path)
    if text is None:
        return problem
    job, problem = plan_script(path, text)
    if job is None:
        return problem
    args.entry = entry_for(text)
    if not args.name:
        args.name = job.name
    problem = apply_set_options(args, job._sql_session.catalog.options)
    if problem:
        return f"{path}: {problem}"
    args.sql_job = job
    return None


def run_sql(args: argparse.Namespace) -> int:
    """`sluice sql`: bad SQL and --explain end here; a planned script runs as `sluice local` runs a job."""
    problem = prepare(args, args.file)
    if problem:
        print(f"sluice sql: {problem}", file=sys.stderr, flush=True)
        return 2
    if args.explain:
        from runtime.sql.explain import explain

        sys.stdout.write(explain(args.sql_job._sql_session))
        return 0
    from runtime.cli.local_commands import run_local

    return run_local(args)


COMMANDS = (
    Command("sql", "run a Flink SQL script on a local cluster (or --explain its plan)", _sql_arguments, run_sql),
)
