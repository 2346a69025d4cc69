"""TLS on links over real loopback sockets, with throwaway CAs made here: mutual authentication works,
and a peer without the right certificate is refused with an error that says so while the listener
keeps serving. Each scenario runs on the standard loop and on uvloop, which production uses."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from netstack.connection import Connection
from netstack.errors import ConnectionLost
from netstack.tls import TlsFiles, client_context, server_context
from netstack.transport import BaseLinkHandler, Link, dial, serve
from tests.support.tls_certs import ClusterCa, make_ca

TOKEN = "tls-secret"
HOST = "127.0.0.1"
DEADLINE_S = 5.0


class Echo(BaseLinkHandler):
    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        ssl_object = link.transport.get_extra_info("ssl_object") if link.transport else None
        peer = ssl_object.getpeercert() if ssl_object is not None else None
        return {"args": args, "tls": ssl_object is not None, "client_cert": bool(peer)}


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClusterCa, ClusterCa]:
    d = tmp_path_factory.mktemp("tls")
    return make_ca(d, "cluster"), make_ca(d, "rogue")


def files(ca: ClusterCa, *, trust: ClusterCa | None = None, cert: bool = True) -> TlsFiles:
    return TlsFiles(ca.node.cert if cert else None, ca.node.key if cert else None, (trust or ca).ca)


def run(scenario: Callable[[], Awaitable[None]], loop: str) -> None:
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(scenario())
    else:
        asyncio.run(scenario())


async def call(port: int, tls: TlsFiles | None) -> Any:
    conn = Connection(local_id="cli", role="client", token=TOKEN, is_client=True)
    link = await dial(HOST, port, conn, BaseLinkHandler(), timeout_s=DEADLINE_S,
                      ssl_context=client_context(tls) if tls else None)
    try:
        return await link.call("echo", {"n": 1}, timeout_s=DEADLINE_S)
    finally:
        link.close("done")


async def listen(tls: TlsFiles) -> tuple[asyncio.Server, int]:
    return await serve(HOST, 0, lambda: Connection(local_id="srv", role="coordinator", token=TOKEN, is_client=False),
                       Echo(), ssl_context=server_context(tls))


LOOPS = ["asyncio", "uvloop"]


class _Watch(logging.Handler):
    """Sets `event` when the listener logs a refused TLS handshake."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "TLS handshake from" in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("loop", LOOPS)
def test_mutual_tls_round_trip(cas: tuple[ClusterCa, ClusterCa], loop: str) -> None:
    cluster, _ = cas

    async def scenario() -> None:
        server, port = await listen(files(cluster))
        try:
            assert await call(port, files(cluster)) == {"args": {"n": 1}, "tls": True, "client_cert": True}
        finally:
            server.close()

    run(scenario, loop)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", ["no-certificate", "other-ca", "plain-tcp"])
def test_client_without_the_right_certificate_is_refused(cas: tuple[ClusterCa, ClusterCa], loop: str,
                                                         client: str, caplog: pytest.LogCaptureFixture) -> None:
    cluster, rogue = cas
    bad = {"no-certificate": files(cluster, cert=False),  # trusts the server, presents nothing
           "other-ca": files(rogue, trust=cluster),  # trusts the server, presents a rogue certificate
           "plain-tcp": None}[client]

    async def scenario() -> None:
        refused = asyncio.Event()
        watch = _Watch(refused)
        logging.getLogger("sluice.net").addHandler(watch)
        server, port = await listen(files(cluster))
        try:
            with pytest.raises(ConnectionLost) as err:
                await call(port, bad)
            message = str(err.value)
            assert "Traceback" not in message
            if client == "plain-tcp":
                assert "lost" in message or "no handshake" in message, message
            else:
                assert "TLS" in message and ("certificate" in message.lower() or "alert" in message.lower()), message
            # the listener says whom it refused, and why, in one line (logged as its handshake task ends)
            await asyncio.wait_for(refused.wait(), DEADLINE_S)
            [line] = [r.getMessage() for r in caplog.records if "TLS handshake from" in r.getMessage()]
            assert line.startswith("rpc listener: TLS handshake from 127.0.0.1:") and "refused: " in line, line
            # the listener keeps serving the right clients
            assert (await call(port, files(cluster)))["client_cert"] is True
        finally:
            server.close()
            logging.getLogger("sluice.net").removeHandler(watch)

    caplog.set_level("WARNING", logger="sluice.net")
    run(scenario, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_client_refuses_a_server_its_ca_did_not_sign(cas: tuple[ClusterCa, ClusterCa], loop: str) -> None:
    cluster, rogue = cas

    async def scenario() -> None:
        server, port = await listen(files(rogue, trust=cluster))  # a rogue server certificate
        try:
            with pytest.raises(ConnectionLost, match="TLS handshake .* failed: .*certificate verify failed"):
                await call(port, files(cluster))
        finally:
            server.close()

    run(scenario, loop)


def test_bad_tls_options_are_one_clear_error(tmp_path: Path, cas: tuple[ClusterCa, ClusterCa]) -> None:
    cluster, _ = cas
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        TlsFiles(cluster.node.cert, None, None)
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="cannot load TLS files .*missing.pem"):
        server_context(TlsFiles(missing, cluster.node.key, None))
    with pytest.raises(ValueError, match="needs --tls-cert and --tls-key"):
        server_context(TlsFiles(None, None, cluster.ca))
    assert TlsFiles.from_options(None, None, None) is None
    ctx = client_context(TlsFiles(None, None, cluster.ca))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname
