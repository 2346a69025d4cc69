"""The `sluice` command line: a table of commands, each a name, its arguments and what runs it.

The families live beside this module: server_commands.py (coordinator, worker), client_commands.py (submit,
status, cancel, checkpoint, savepoint, rescale, upgrade, checkpoints, probe), local_commands.py (local,
demo, data) and sql_command.py (sql). A new command is one `Command` entry in its family's table. Configuration is
parsed and checked once, while the command line is, and passed down as frozen dataclasses; a bad argument exits
with status 2 and a one-line reason, and so does a configuration error found after parsing (a token file, a
combination of flags).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from netstack.errors import NetstackError, RpcError
from netstack.limits import raise_nofile_limit
from runtime.cli import arguments, client_commands, local_commands, server_commands, sql_command
from runtime.cli.command import Command
from runtime.cli.job_options import job_config

COMMANDS: tuple[Command, ...] = (*server_commands.COMMANDS, *client_commands.COMMANDS, *local_commands.COMMANDS,
                                  *sql_command.COMMANDS)
BY_NAME = {command.name: command for command in COMMANDS}

# the names the tests and tools import from here
coordinator_config = server_commands.coordinator_config
_client_token = client_commands.client_token
_job_config = job_config
_parallelism = arguments.parallelism


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Streaming dataflow runtime with fast checkpoints.")
    parser.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        _add_command(sub.add_parser(command.name, help=command.help), command)
    return parser


def _add_command(parser: argparse.ArgumentParser, command: Command) -> None:
    if command.client:
        parser.add_argument("--coordinator", type=arguments.addresses, required=True,
                            metavar="HOST:PORT[,HOST:PORT...]")
    command.add_arguments(parser)
    if command.client:
        parser.add_argument("--token-file")
        parser.add_argument("--state-dir", help="read the cluster token from STATE_DIR/token (what `sluice local` "
                                                "writes and prints)")
        arguments.add_tls_options(parser, listens=False)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_nofile_limit()  # every socket counts against it; the usual soft 1024 is too few for a busy port
    command = BY_NAME[args.command]
    try:
        return command.run(args)
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
        reason = command.explain_os_error(args, exc) if command.explain_os_error else None
        if reason is None:
            raise
        print(f"sluice {args.command}: {reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
