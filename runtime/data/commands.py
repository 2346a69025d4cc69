"""`sluice data generate|verify|state`: argument checks, one SparkSession per command, the printed result.

Exit status: 0 on success (verify: output matches), 1 when verify finds a
difference, 2 on a bad argument, a missing input, or missing Java/PySpark.
Arguments are checked before Spark starts, so those errors come back in
well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from runtime.data.generate import check_generate_args, generate
from runtime.data.spark import DataError, check_environment, is_connect, start_session, stop_session
from runtime.data.tables import OutputTable
from runtime.data.verify import EventTimeOptions, check_verify_args, verify

PATH_ARGS = ("out", "input", "output", "late_output", "source", "checkpoint")


def run(args: argparse.Namespace) -> int:
    command = args.data_command
    if is_connect(getattr(args, "master", "")):  # a Connect server resolves paths in its own working directory
        for name in PATH_ARGS:
            value = getattr(args, name, None)
            if isinstance(value, str) and value and "://" not in value:
                setattr(args, name, os.path.abspath(value))
    try:
        if command == "generate":
            return _generate(args)
        if command == "verify":
            return _verify(args)
        if command == "state":
            from runtime.data.state_commands import run_state

            return run_state(args)
        if command == "nexmark":
            return _nexmark(args)
    except DataError as exc:
        text = str(exc)
        if command == "state":
            command = f"state {args.state_command}"
        print(text if text.startswith("sluice ") else f"sluice data {command}: {text}", file=sys.stderr)
        return 2
    raise AssertionError(command)


def _session(args: argparse.Namespace) -> Any:
    check_environment(args.master)
    return start_session(args.master, f"sluice-data-{args.data_command}")


def _generate(args: argparse.Namespace) -> int:
    options = dict(rows=args.rows, keys=args.keys, skew=args.skew, zipf_exponent=args.zipf_exponent,
                   partitions=args.partitions, row_group_rows=args.row_group_rows, seed=args.seed,
                   jitter_ms=args.jitter_ms)
    check_generate_args(args.out, **options)
    spark = _session(args)
    try:
        result = generate(spark, args.out, **options)
    finally:
        stop_session(spark)
    print(result.summary())
    return 0


def _nexmark(args: argparse.Namespace) -> int:
    from runtime.data.nexmark import check_nexmark_args, generate_nexmark

    check_nexmark_args(args.out, args.events, args.seed)
    spark = _session(args)
    try:
        result = generate_nexmark(spark, args.out, events=args.events, seed=args.seed)
    finally:
        stop_session(spark)
    print(result.summary())
    return 0


def _verify(args: argparse.Namespace) -> int:
    options = EventTimeOptions(window_ms=args.window_ms, slide_ms=args.slide_ms, max_delay_ms=args.max_delay_ms,
                               allowed_lateness_ms=args.allowed_lateness_ms, gap_ms=args.gap_ms,
                               late_output=args.late_output, right_input=args.right_input,
                               lower_ms=args.lower_ms, upper_ms=args.upper_ms)
    table = OutputTable.parse(args.output_format, args.output, args.catalog)
    check_verify_args(args.input, args.output, args.query, options, table=table)
    spark = _session(args)
    try:
        result = verify(spark, args.input, args.output, args.query, options, table=table)
    finally:
        stop_session(spark)
    print(json.dumps(result.to_json(), indent=2) if args.json else result.report())
    return 0 if result.ok else 1
