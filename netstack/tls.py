"""Optional TLS for every link (RPC, data, worker to coordinator), from three files.

`TlsFiles(cert, key, ca)`:
- a process that listens needs `cert` and `key`;
- with `ca`, a listener requires the peer's certificate to be signed by it
  (mutual TLS) and a dialer checks the listener's certificate against it.
  The CA is meant to be the cluster's own: any certificate it signed is a
  member, so host names are not checked (workers advertise addresses the
  certificate need not list). The cluster token is still required on top.
- without `ca`, a dialer checks the listener against the system's trusted
  CAs and the host name it dialed, and a listener asks for no client
  certificate (the token authenticates the client).

Built once at start-up; a missing or unreadable file is a ValueError naming
the file, so the entry point prints one line and exits.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsFiles:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("--tls-cert and --tls-key go together")

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
        """None when no TLS option is given: plain TCP."""
        if not (cert or key or ca):
            return None
        return cls(cert or None, key or None, ca or None)

    def as_args(self) -> list[str]:
        """The same options for a child process's command line."""
        args: list[str] = []
        for flag, value in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca)):
            if value:
                args += [flag, value]
        return args


def _base(purpose: ssl.Purpose, files: TlsFiles) -> ssl.SSLContext:
    protocol = ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if files.cert and files.key:
            ctx.load_cert_chain(files.cert, files.key)
        if files.ca:
            ctx.load_verify_locations(cafile=files.ca)
    except (OSError, ssl.SSLError) as exc:
        which = ", ".join(f"{label} {path}" for label, path in
                          (("--tls-cert", files.cert), ("--tls-key", files.key), ("--tls-ca", files.ca)) if path)
        raise ValueError(f"cannot load TLS files ({which}): {exc}") from None
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """For a listener: presents `cert`; with `ca`, requires a client certificate signed by it."""
    if not (files.cert and files.key):
        raise ValueError("a listening process needs --tls-cert and --tls-key for TLS")
    ctx = _base(ssl.Purpose.CLIENT_AUTH, files)
    ctx.verify_mode = ssl.CERT_REQUIRED if files.ca else ssl.CERT_NONE
    return ctx


def http_server_context(files: TlsFiles) -> ssl.SSLContext:
    """For the REST and metrics listeners: the same certificate as RPC, but a client certificate is optional
    (a browser has none; the REST API checks the token, and Prometheus may present one: with `ca` it must then
    be signed by it)."""
    ctx = server_context(files)
    ctx.verify_mode = ssl.CERT_OPTIONAL if files.ca else ssl.CERT_NONE
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """For a dialer: presents `cert` if given; checks the listener against `ca`, or the system CAs."""
    ctx = _base(ssl.Purpose.SERVER_AUTH, files)
    if files.ca:
        ctx.check_hostname = False  # the cluster's own CA: membership, not names (see above)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
