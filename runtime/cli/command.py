"""One `sluice` command as an entry of the command table (runtime/cli/main.py): its name, its arguments and
what runs it, as the coordinator's RPC handler table maps a method to its handler."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit status
    # a client of a running coordinator: the parser also gets --coordinator (first), --token-file, --state-dir
    # (where `sluice local` keeps the token) and the TLS client options
    client: bool = False
    # one line for an OSError the command's run raised (a port it could not listen on), or None: not ours
    explain_os_error: Callable[[argparse.Namespace, OSError], str | None] | None = None
