"""Bind and advertised addresses: what a process listens on, and what it tells others to dial.

A process may bind every interface (`--host 0.0.0.0`) yet must tell its peers one address they can reach it
at (`--advertise 10.0.0.5`): a worker registers its advertised address with the coordinator, which hands it
to the other workers as the place to open data links. Nothing here assumes loopback. Checks are pure; the
one function that asks the kernel (`local_address_towards`) says so.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable

WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARDS


def check_host(text: str, *, flag: str = "--host") -> str:
    """An IP address (v4, or v6 with or without brackets) or a host name (RFC 1123), as given; ValueError
    otherwise, with a one-line reason naming the flag."""
    host = text.strip()
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare:
        raise ValueError(f"{flag}: empty address")
    try:
        ipaddress.ip_address(bare)
        return bare
    except ValueError:
        pass
    if ":" in bare:
        raise ValueError(f"{flag}: {text!r} is not an address (give the host only, without a port)"
                         if bare.count(":") == 1 else f"{flag}: {text!r} is not a valid IPv6 address")
    if bare.replace(".", "").isdigit():
        raise ValueError(f"{flag}: {text!r} is not a valid IPv4 address")
    name = bare[:-1] if bare.endswith(".") else bare
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(f"{flag}: {text!r} is not an IP address or host name")
    return bare


def check_advertise(text: str) -> str:
    """An address others can dial: a host, never a wildcard (0.0.0.0 is where one listens, not an address)."""
    host = check_host(text, flag="--advertise")
    if is_wildcard(host):
        raise ValueError(f"--advertise: {text!r} is a wildcard address; give the address other machines reach "
                         "this one at")
    return host


def advertised_host(host: str, advertise: str, *, fallback: Callable[[], str]) -> str:
    """What to tell peers: `advertise` if given, else the bind address unless it is a wildcard, else
    `fallback()` (a worker: its address towards the coordinator; the coordinator: its host name)."""
    if advertise:
        return advertise
    if not is_wildcard(host):
        return host
    return fallback()


def local_address_towards(host: str, port: int) -> str:
    """The local address the kernel would use to reach host:port (a UDP `connect` sends no packet): with a
    wildcard bind, the address on the interface that faces the coordinator is the one peers can reach."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.connect(address)
        return str(s.getsockname()[0])
