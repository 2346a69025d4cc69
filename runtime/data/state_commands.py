"""`sluice data state read|bootstrap|transform`: arguments, checks before Spark starts, the printed result.

Exit status 0 on success, 2 on bad input (a checkpoint that is not one, a uid it does not have, a job module
without that uid, a Parquet input without the key column, an output that exists): one line on stderr, and
nothing written. Every check that needs no Spark runs before Spark starts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from runtime.data.checkpoint_state import KINDS, check_output, open_checkpoint, transform, verify_operator_files
from runtime.data.spark import DataError, check_environment, start_session, stop_session


def add_state_parser(dsub: Any) -> None:
    state = dsub.add_parser("state", help="read, bootstrap and transform checkpoint state (Spark)")
    ssub = state.add_subparsers(dest="state_command", required=True)
    rd = ssub.add_parser("read", help="an operator's state in a checkpoint or savepoint, as Parquet rows")
    rd.add_argument("checkpoint", metavar="CHECKPOINT", help="a chk-N or savepoint directory")
    rd.add_argument("--uid", required=True, help="the operator's uid")
    rd.add_argument("--kind", choices=KINDS, default="value",
                    help="value (default): key, key_group, state, value; list and map: one row per element; "
                         "timers; channels: the in-flight records of an unaligned checkpoint")
    rd.add_argument("--state-name", help="only this state (value, list, map)")
    rd.add_argument("-o", "--out", required=True, help="Parquet output directory (must not exist)")
    bs = ssub.add_parser("bootstrap", help="write a savepoint whose operator state comes from Parquet rows")
    bs.add_argument("--uid", required=True, help="the operator whose keyed state the rows are")
    bs.add_argument("--job", required=True, metavar="MODULE:FUNCTION",
                    help="the job that will start from the savepoint (imported as `sluice local` does)")
    bs.add_argument("--from", dest="source", required=True, metavar="DATA", help="Parquet file or directory")
    bs.add_argument("--key-col", required=True, help="the key column (a `<name>_msgpack` column is decoded)")
    bs.add_argument("--state-name", help="the state the values go to (default: each row's `state` column)")
    bs.add_argument("--value-col", default="value", help="the value column (default value)")
    bs.add_argument("--parallelism", type=int, help="subtasks to cut the state for (default: the job's)")
    bs.add_argument("-o", "--out", required=True, help="the savepoint directory (must not exist)")
    tf = ssub.add_parser("transform", help="a new savepoint from a checkpoint, with state dropped, uids renamed "
                                           "or values rewritten (the input is never modified)")
    tf.add_argument("checkpoint", metavar="CHECKPOINT")
    tf.add_argument("--drop", action="append", default=[], metavar="UID", help="drop this operator's state")
    tf.add_argument("--rename", action="append", default=[], metavar="OLD=NEW", help="rename a uid")
    tf.add_argument("--rewrite", action="append", default=[], metavar="UID=MODULE:FUNCTION",
                    help="replace each value of the operator's keyed state by FUNCTION(key, state, value)")
    tf.add_argument("-o", "--out", required=True, help="the new savepoint directory (must not exist)")
    for p in (rd, tf):
        p.add_argument("--state-remote-address", metavar="HOST:PORT",
                       help="the state server, for a checkpoint of the remote backend")
    for p in (rd, bs):
        p.add_argument("--master", default="local[2]",
                         help="Spark master (default local[2]; sc://HOST:PORT: a running Spark Connect server)")


def run_state(args: argparse.Namespace) -> int:
    command = args.state_command
    if os.getcwd() not in sys.path:  # job modules (--job, --rewrite) import from here, as `sluice local` does
        sys.path.insert(0, os.getcwd())
    if command == "read":
        return _read(args)
    if command == "bootstrap":
        return _bootstrap(args)
    if command == "transform":
        return _transform(args)
    raise AssertionError(command)


def _session(args: argparse.Namespace) -> Any:
    check_environment(args.master)
    return start_session(args.master, f"sluice-data-state-{args.state_command}")


def _read(args: argparse.Namespace) -> int:
    from runtime.data.state_processor import read_state

    check_output(args.out)
    # a typo, and a file the restore would refuse, fail here, in well under a second and before Spark starts
    verify_operator_files(open_checkpoint(args.checkpoint), args.uid)
    spark = _session(args)
    try:
        frame = read_state(spark, args.checkpoint, args.uid, args.kind, state_name=args.state_name,
                           remote_address=args.state_remote_address)
        frame.write.parquet(args.out)
        rows = spark.read.parquet(args.out).count()
    finally:
        stop_session(spark)
    print(f"sluice data state read: {rows} {args.kind} rows of {args.uid} -> {args.out}")
    return 0


def _bootstrap(args: argparse.Namespace) -> int:
    from runtime.data.checkpoint_state import graph_of_job, target_in
    from runtime.data.state_processor import bootstrap

    check_output(args.out)
    if not os.path.exists(args.source) and "://" not in args.source:
        raise DataError(f"{args.source}: no such file or directory")
    if args.parallelism is not None and args.parallelism < 1:
        raise DataError("--parallelism must be at least 1")
    graph, max_parallelism = graph_of_job(args.job)
    target_in(graph, args.uid, max_parallelism, f"job {args.job}")
    if "://" not in args.source:  # a local input's columns are checked before Spark starts
        import pyarrow.dataset as ds

        from runtime.data.state_processor import check_columns

        try:
            names = ds.dataset(args.source, format="parquet").schema.names
        except (OSError, ValueError) as exc:
            raise DataError(f"{args.source}: cannot read it as Parquet ({exc})") from None
        check_columns(names, args.source, key_col=args.key_col, value_col=args.value_col,
                      state_name=args.state_name)
    spark = _session(args)
    try:
        result = bootstrap(spark, args.source, args.out, uid=args.uid, job=args.job, key_col=args.key_col,
                           value_col=args.value_col, state_name=args.state_name, parallelism=args.parallelism)
    finally:
        stop_session(spark)
    print(f"sluice data state bootstrap: {result['keys']} keys of {args.uid} in {result['subtasks']} subtasks "
          f"-> {args.out}")
    return 0


def _transform(args: argparse.Namespace) -> int:
    rename = dict(_pair(r, "--rename") for r in args.rename)
    rewrite = {uid: _function(spec) for uid, spec in (_pair(r, "--rewrite") for r in args.rewrite)}
    if not (args.drop or rename or rewrite):
        raise DataError("nothing to do: give --drop, --rename or --rewrite")
    counts = transform(open_checkpoint(args.checkpoint), args.out, drop=args.drop, rename=rename, rewrite=rewrite,
                       remote_address=args.state_remote_address)
    print(f"sluice data state transform: {counts['dropped']} entries dropped, {counts['rewritten']} rewritten, "
          f"{len(rename)} uids renamed -> {args.out}")
    return 0


def _pair(text: str, flag: str) -> tuple[str, str]:
    left, sep, right = text.partition("=")
    if not sep or not left or not right:
        raise DataError(f"{flag} takes A=B, not {text!r}")
    return left, right


def _function(spec: str) -> Callable[[Any, str, Any], Any]:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise DataError(f"--rewrite takes UID=MODULE:FUNCTION, not {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"--rewrite {spec}: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise DataError(f"--rewrite {spec} is not a function")
    return fn  # type: ignore[no-any-return]
