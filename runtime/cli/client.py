"""A short-lived RPC client of the coordinator, for the CLI and tests."""

from __future__ import annotations

import secrets
from typing import Any

from netstack.connection import Connection
from netstack.tls import TlsFiles, client_context
from netstack.transport import BaseLinkHandler, dial


async def call_coordinator(host: str, port: int, token: str, method: str, args: dict[str, Any] | None = None, *,
                           timeout_s: float = 30.0, tls: TlsFiles | None = None) -> Any:
    conn = Connection(local_id=f"cli-{secrets.token_hex(3)}", role="client", token=token, is_client=True)
    link = await dial(host, port, conn, BaseLinkHandler(), timeout_s=timeout_s,
                      ssl_context=client_context(tls) if tls else None)
    try:
        return await link.call(method, args or {}, timeout_s=timeout_s)
    finally:
        link.close("done")
