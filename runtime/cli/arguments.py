"""The argument types and option groups the `sluice` commands share, and flags built from settings fields.

Every value is parsed and checked while the command line is: a bad one exits with status 2 and one line
naming the flag (argparse's error), before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from netstack.limits import ListenerLimits
from netstack.tls import TlsFiles
from runtime.common import objectstore
from runtime.common.addresses import check_advertise, check_host
from runtime.graph import config
from runtime.graph.flags import Flag, flags_of
from runtime.graph.flags import given as given_flags


def argument_type(parse: Callable[[str], Any], strip_prefix: bool = False) -> Callable[[str], Any]:
    """An argparse type from a parse function that raises ValueError: its reason becomes the one-line error.
    `strip_prefix` drops the reason's leading "what: " (the flag already says what)."""
    if parse in (int, float, str):
        return parse  # argparse names them itself ("invalid int value: 'x'")

    def parse_argument(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            reason = str(exc).split(": ", 1)[1] if strip_prefix and ": " in str(exc) else str(exc)
            raise argparse.ArgumentTypeError(reason) from None

    parse_argument.__name__ = getattr(parse, "__name__", "value")
    return parse_argument


duration = argument_type(config.parse_duration)
duration_or_zero = argument_type(config.parse_duration_or_zero)
positive = argument_type(config.parse_positive)
byte_size = argument_type(config.parse_bytes)
parallelism = argument_type(config.parse_parallelism)
address = argument_type(config.parse_address)
host = argument_type(check_host, strip_prefix=True)
advertise = argument_type(check_advertise, strip_prefix=True)
storage_path = argument_type(objectstore.absolute)


never_or_duration = argument_type(config.parse_never_or_duration)


def addresses(text: str) -> tuple[tuple[str, int], ...]:
    """One coordinator, or the leader and its standbys (tried in turn: the leader answers)."""
    return tuple(address(part.strip()) for part in text.split(",") if part.strip()) or (address(text),)


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def absolute(path: str | None) -> str | None:
    """A local path made absolute (the coordinator has another working directory); an s3:// URL as it is."""
    return objectstore.absolute(path) if path else None


# -- flags declared on settings fields (runtime/graph/flags.py) -------------------------------------------------


def add_flag(parser: argparse.ArgumentParser | Any, spec: Flag) -> None:
    """One argument from a field's flag. Its argparse default is None unless the flag has its own, so a flag not
    given stays out of the settings document (`settings_document`) and the field's default applies."""
    options: dict[str, Any] = {"help": spec.help or None, "default": spec.default}
    if spec.action in ("store_true", "store_false"):
        options["action"] = spec.action
    else:
        if spec.action is not None:
            options["action"] = spec.action
        if spec.parse is not None:
            options["type"] = argument_type(spec.parse)
        if spec.choices is not None:
            options["choices"] = list(spec.choices)
        if spec.metavar is not None:
            options["metavar"] = spec.metavar
    parser.add_argument(spec.name, dest=spec.dest, **options)


def add_flags(groups: dict[str, Any], settings: type[Any]) -> None:
    """Every flag of the dataclass `settings`, each in the group its flag names ("" is the parser itself)."""
    for _, spec in flags_of(settings):
        add_flag(groups[spec.group], spec)


def settings_document(args: argparse.Namespace, settings: type[Any]) -> dict[str, Any]:
    """field name -> value of the flags of `settings` given on the command line."""
    return given_flags(vars(args), settings)


# -- option groups several commands share ----------------------------------------------------------------------


def add_address_options(p: argparse.ArgumentParser, what: str, fallback: str) -> None:
    p.add_argument("--host", type=host, default="127.0.0.1",
                   help=f"address to bind the {what} on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--advertise", type=advertise, default=None, metavar="ADDRESS",
                   help=f"address other machines reach this one at (default: --host, or {fallback} when --host "
                        "is a wildcard)")


def add_listener_options(p: argparse.ArgumentParser, which: str) -> None:
    g = p.add_argument_group(f"connections to the {which} port (the metrics port has its own small limits)")
    g.add_argument("--max-connections", type=positive, default=1024,
                   help="connections held at once; beyond, the oldest one still in its handshake is dropped, "
                        "else the new one is refused (default 1024)")
    g.add_argument("--max-pending", type=positive, default=128,
                   help="connections still in their handshake; a new one drops the oldest (default 128)")
    g.add_argument("--handshake-timeout", type=duration, default=10.0,
                   help="close a connection that has not completed its handshake by then (10s)")


def listener_limits(args: argparse.Namespace) -> ListenerLimits:
    return ListenerLimits(max_connections=args.max_connections, max_pending=args.max_pending,
                          handshake_timeout_s=args.handshake_timeout)


def add_tls_options(p: argparse.ArgumentParser, listens: bool) -> None:
    g = p.add_argument_group("TLS (off unless given; docs/ARCHITECTURE.md, Trust model)")
    g.add_argument("--tls-cert", metavar="PEM", help="this process's certificate" + (
        " (needed to serve TLS)" if listens else " (for a listener that requires client certificates)"))
    g.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    g.add_argument("--tls-ca", metavar="PEM",
                   help="the cluster's CA: peers must present a certificate it signed (mutual TLS); without it, "
                        "a listener is checked against the system CAs and its host name")


def tls(args: argparse.Namespace) -> TlsFiles | None:
    return TlsFiles.from_options(args.tls_cert, args.tls_key, args.tls_ca)
