"""Bad input against live processes closes only the offending connection.

Every case opens a plain blocking socket to a live coordinator or worker,
sends something that breaks the protocol (DESIGN.md section 4), and checks:

* the server closes that connection: a GOODBYE frame naming the reason, then EOF;
* the process logs one WARNING line naming the peer (role, id, address) and the reason;
* `sluice_connections_refused_total{reason=...}` on its metrics endpoint goes up by one;
* the process keeps serving: the coordinator answers status, both workers stay
  registered, and the job running across both workers keeps making progress.

The processes are shared by the whole module (starting a cluster per case would
dominate the run time); each case therefore looks only at the log written and the
metric change made after it started.

Frames are built here with `struct`, not with netstack's encoder, so the tests do
not trust the code under test to describe the wire format.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from netstack.credit import CreditLedger
from netstack.errors import CloseReason
from netstack.transport import HANDSHAKE_TIMEOUT_S, PROTOCOL_FAILURES
from runtime.worker.network import NetworkEnvironment
from tests.support.cluster import Cluster, poll, write_module

pytestmark = pytest.mark.integration

# -- the wire format, written out independently of netstack/frames.py -------------------------------------

HEADER = struct.Struct(">2sBBBIQI")  # magic, version, type, flags, channel, seq, length
HELLO, HELLO_ACK, DATA, EVENT, CREDIT, RPC_REQUEST, RPC_RESPONSE, GOODBYE = range(1, 9)
DATA_PREFIX = struct.Struct(">II")  # backlog, offset of the first record in the buffer
IO_TIMEOUT_S = 10.0


def header(ftype: int, length: int, *, magic: bytes = b"SL", version: int = 1, flags: int = 0, channel: int = 0,
           seq: int = 0) -> bytes:
    return HEADER.pack(magic, version, ftype, flags, channel, seq, length)


def frame(ftype: int, payload: bytes = b"", **fields: Any) -> bytes:
    return header(ftype, len(payload), **fields) + payload


def hello(token: str, peer_id: str, role: str = "client", version: int = 1) -> bytes:
    body = {"version": version, "token": token, "id": peer_id, "role": role, "info": {}}
    return frame(HELLO, msgpack.packb(body))


def data_frame(channel: int, seq: int, records: list[Any]) -> bytes:
    body = b"".join(msgpack.packb(r) for r in records)
    return frame(DATA, DATA_PREFIX.pack(0, 0) + body, channel=channel, seq=seq)


@dataclass
class Reply:
    type: int
    channel: int
    seq: int
    payload: bytes

    def body(self) -> Any:
        return msgpack.unpackb(self.payload, raw=False)


def parse(data: bytes) -> list[Reply]:
    """Whole frames in `data`; fails the test on a partial or foreign frame."""
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= HEADER.size, f"server sent a partial header: {data[pos:]!r}"
        magic, version, ftype, _flags, channel, seq, length = HEADER.unpack_from(data, pos)
        assert (magic, version) == (b"SL", 1), f"server sent a bad header: {data[pos:pos + HEADER.size]!r}"
        pos += HEADER.size
        assert len(data) - pos >= length, "server sent a partial frame"
        out.append(Reply(ftype, channel, seq, data[pos:pos + length]))
        pos += length
    return out


def read_frame(sock: socket.socket) -> Reply:
    """Exactly one frame (blocking, with the socket's timeout)."""

    def read_exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, f"EOF after {len(buf)} of {n} bytes"
            buf += chunk
        return buf

    head = read_exactly(HEADER.size)
    return parse(head + read_exactly(HEADER.unpack(head)[-1]))[0]


def read_to_eof(sock: socket.socket, timeout_s: float = IO_TIMEOUT_S) -> bytes:
    """Everything until the server closes; fails if it does not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"server did not close the connection within {timeout_s}s (got {data!r})")


# -- the live cluster -------------------------------------------------------------------------------------

ENDLESS_JOB = '''
from runtime.api import DiscardSink, GeneratorSource, KeyedProcessFunction


from runtime.examples.wordcount import Count  # the README's keyed word count


def build(job):
    """Two sources hash-partitioned into two counters: channels cross between the two workers."""
    (job.source(GeneratorSource(count=None, keys=50, records_per_second=1000), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))


def build_bounded(job):
    (job.source(GeneratorSource(count=5000, keys=50), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))
'''

BROKEN_JOB = "import sluice_dependency_that_is_not_installed  # noqa\n\ndef build(job):\n    pass\n"


@dataclass
class Silent:
    """A connection opened at module start that never says hello."""

    sock: socket.socket
    local: str
    opened_at: float
    log_offset: int


@dataclass
class Live:
    cluster: Cluster
    job_id: str
    channel_base: int
    silent: Silent

    @property
    def coordinator_metrics(self) -> str:
        assert self.cluster.coordinator is not None
        return self.cluster.coordinator.fields["metrics"]

    def worker(self, wid: str) -> Any:
        return next(w for w in self.cluster.workers if w.fields["id"] == wid)

    def job(self) -> dict[str, Any]:
        return self.cluster.call("status", {"job_id": self.job_id})

    def records_in(self) -> int:
        return sum(t["records_in"] for t in self.job()["tasks"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A coordinator, two workers and an endless job whose channels cross between the workers."""
    tmp = tmp_path_factory.mktemp("bad_input")
    cluster = Cluster(tmp)
    silent: socket.socket | None = None
    try:
        cluster.start_coordinator()
        # opened first so that the handshake timeout runs out while the other cases run
        offset = len(cluster.log("coordinator"))
        silent = socket.create_connection(cluster.rpc, timeout=IO_TIMEOUT_S)
        host, port = silent.getsockname()[:2]
        silent_info = Silent(silent, f"{host}:{port}", time.monotonic(), offset)
        for _ in range(2):
            cluster.start_worker("--heartbeat-interval", "200ms")
        cluster.wait_workers(2)
        write_module(tmp, "endless_job", ENDLESS_JOB)
        write_module(tmp, "broken_job", BROKEN_JOB)
        # The first submission to a coordinator gets channel ids from 1 (coordinator/server.py: _channel_base),
        # which is how the tests below know the ids of real channels.
        job_id = cluster.submit("endless_job:build")
        live = Live(cluster, job_id, channel_base=1, silent=silent_info)

        def all_running() -> bool:
            job = live.job()
            assert job["state"] in ("DEPLOYING", "RUNNING"), job
            return job["state"] == "RUNNING" and len(job["tasks"]) == 4 and live.records_in() > 0

        poll(all_running, 30, "the endless job to run on both workers")
        yield live
        assert live.job()["state"] == "RUNNING", "the endless job did not survive the bad input"
        assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"
    finally:
        if silent is not None:
            silent.close()
        cluster.stop()
        for proc in [*cluster.workers, *([cluster.coordinator] if cluster.coordinator else [])]:
            assert proc.proc.poll() is not None, f"process {proc.pid} survived the test"


def refused_total(metrics_address: str, reason: CloseReason) -> float:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=IO_TIMEOUT_S) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("sluice_connections_refused_total{") and f'reason="{reason.value}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_log_line(cluster: Cluster, name: str, offset: int, *needles: str) -> str:
    """The first line written to `name`'s log after `offset` that contains every needle."""
    found: list[str] = []

    def present() -> bool:
        found.extend(line for line in cluster.log(name)[offset:].splitlines() if all(n in line for n in needles))
        return bool(found)

    poll(present, 10, f"a line with {needles} in {name}.log")
    return found[0]


def assert_still_serving(live: Live) -> None:
    status = live.cluster.call("status")
    assert sorted(w["id"] for w in status["workers"]) == ["worker-1", "worker-2"]
    assert live.job()["state"] == "RUNNING"
    before = live.records_in()
    poll(lambda: live.records_in() > before, 10, "the running job to make progress")


@dataclass
class Target:
    name: str  # log name: coordinator, worker-1, ...
    address: tuple[str, int]
    metrics: str


def coordinator_target(live: Live) -> Target:
    return Target("coordinator", live.cluster.rpc, live.coordinator_metrics)


def worker_target(live: Live, wid: str) -> Target:
    w = live.worker(wid)
    return Target(wid, w.address("data"), w.fields["metrics"])


def expect_refusal(live: Live, target: Target, reason: CloseReason, detail: str, *, before_close: bytes = b"",
                   handshake: bytes = b"", payload: bytes = b"", half_close: bool = False,
                   peer: str = "? ?") -> tuple[Reply, str]:
    """Send `handshake` (and read its HELLO_ACK), then `payload`; the server must say goodbye and close.

    Returns the GOODBYE and the log line.
    """
    cluster = live.cluster
    refused_before = refused_total(target.metrics, reason)
    offset = len(cluster.log(target.name))
    with socket.create_connection(target.address, timeout=IO_TIMEOUT_S) as sock:
        host, port = sock.getsockname()[:2]
        local = f"{host}:{port}"
        if handshake:
            sock.sendall(handshake)
            ack = read_frame(sock)
            assert ack.type == HELLO_ACK, ack
        sock.sendall(payload)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        replies = parse(read_to_eof(sock))
    assert [r.type for r in replies] == [GOODBYE], replies
    goodbye = replies[0]
    said = goodbye.body()["reason"]
    assert reason.value in said and detail in said, said

    line = wait_log_line(cluster, target.name, offset, "closing connection with", local)
    assert "WARNING" in line, line
    assert f"closing connection with {peer} at {local}: {reason.value}" in line, line
    assert detail in line, line
    assert "Traceback" not in cluster.log(target.name)[offset:]

    poll(lambda: refused_total(target.metrics, reason) == refused_before + 1, 10,
         f"sluice_connections_refused_total{{reason={reason.value!r}}} on {target.name} to go up by one")
    assert_still_serving(live)
    return goodbye, line


# -- the coordinator's RPC port ---------------------------------------------------------------------------

_HELLO_BODY = msgpack.packb({"version": 1, "token": "t", "id": "x", "role": "client", "info": {}})

COORDINATOR_CASES = {
    "garbage": (b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n", False,
                CloseReason.BAD_MAGIC, "bad magic b'GE'"),
    "header-version": (header(HELLO, 0, version=2), False,
                       CloseReason.BAD_VERSION, "protocol version 2, this process speaks 1"),
    "unknown-type": (header(99, 0), False, CloseReason.UNKNOWN_TYPE, "unknown frame type 99"),
    "oversized": (header(HELLO, 2**31), False, CloseReason.OVERSIZED, "frame of 2147483648 bytes exceeds the maximum"),
    "truncated-header": (header(HELLO, 40)[:10], True,
                         CloseReason.TRUNCATED, "stream ended with 10 bytes of an unfinished frame"),
    "truncated-payload": (header(HELLO, len(_HELLO_BODY)) + _HELLO_BODY[:7], True,
                          CloseReason.TRUNCATED, "stream ended with 7 bytes of an unfinished frame"),
    "rpc-before-hello": (frame(RPC_REQUEST, msgpack.packb(["status", {}]), seq=1), False,
                         CloseReason.UNEXPECTED, "RPC_REQUEST frame not allowed while await hello"),
    "hello-not-msgpack": (frame(HELLO, b"\xc1\xc1\xc1"), False,
                          CloseReason.BAD_PAYLOAD, "hello payload does not decode: FormatError"),
    "hello-without-token": (frame(HELLO, msgpack.packb({"id": "x", "version": 1})), False,
                            CloseReason.BAD_HANDSHAKE, "hello without id and token"),
}


@pytest.mark.parametrize("case", list(COORDINATOR_CASES))
def test_coordinator_refuses_malformed_stream(live: Live, case: str) -> None:
    """Broken framing before any handshake: the peer is only known by its address."""
    payload, half_close, reason, detail = COORDINATOR_CASES[case]
    expect_refusal(live, coordinator_target(live), reason, detail, payload=payload, half_close=half_close)


def test_coordinator_refuses_wrong_token(live: Live) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    pid = "intruder-" + secrets.token_hex(3)
    goodbye, line = expect_refusal(live, coordinator_target(live), CloseReason.BAD_TOKEN, "wrong cluster token",
                                   payload=hello(wrong, pid), peer=f"client {pid}")
    log = live.cluster.log("coordinator")
    for secret in (wrong, live.cluster.token):
        assert secret not in log and secret not in goodbye.body()["reason"], "a token leaked"


def test_coordinator_refuses_other_protocol_version_in_hello(live: Live) -> None:
    pid = "old-client-" + secrets.token_hex(3)
    expect_refusal(live, coordinator_target(live), CloseReason.BAD_VERSION, "hello for protocol version 7",
                   payload=hello(live.cluster.token, pid, version=7), peer=f"client {pid}")


def test_coordinator_refuses_data_on_rpc_link(live: Live) -> None:
    pid = "confused-" + secrets.token_hex(3)
    expect_refusal(live, coordinator_target(live), CloseReason.UNKNOWN_CHANNEL, "data for unknown channel 5",
                   handshake=hello(live.cluster.token, pid), payload=data_frame(5, 1, ["x"]), peer=f"client {pid}")


def test_coordinator_refuses_malformed_rpc_after_handshake(live: Live) -> None:
    pid = "sloppy-" + secrets.token_hex(3)
    expect_refusal(live, coordinator_target(live), CloseReason.BAD_PAYLOAD, "rpc request is not [method, args]",
                   handshake=hello(live.cluster.token, pid), payload=frame(RPC_REQUEST, msgpack.packb("status")),
                   peer=f"client {pid}")


def test_unknown_rpc_method_is_an_error_not_a_disconnect(live: Live) -> None:
    """A well-formed call to a method that does not exist gets an error reply; the connection stays usable."""
    token = live.cluster.token
    with socket.create_connection(live.cluster.rpc, timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(hello(token, "curious-" + secrets.token_hex(3)))
        assert read_frame(sock).type == HELLO_ACK
        sock.sendall(frame(RPC_REQUEST, msgpack.packb(["no_such_method", {}]), seq=41))
        reply = read_frame(sock)
        assert (reply.type, reply.seq) == (RPC_RESPONSE, 41)
        ok, message, error_type = reply.body()
        assert (ok, error_type) == (False, "UnknownMethod") and "no_such_method" in message
        sock.sendall(frame(RPC_REQUEST, msgpack.packb(["status", {}]), seq=42))
        reply = read_frame(sock)
        assert (reply.type, reply.seq, reply.body()[0]) == (RPC_RESPONSE, 42, True)
    assert_still_serving(live)


# -- a worker's data port ---------------------------------------------------------------------------------


def test_worker_refuses_wrong_token(live: Live) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    goodbye, _ = expect_refusal(live, worker_target(live, "worker-2"), CloseReason.BAD_TOKEN, "wrong cluster token",
                                payload=hello(wrong, "worker-1", role="worker"), peer="worker worker-1")
    assert wrong not in live.cluster.log("worker-2")


def test_worker_refuses_garbage(live: Live) -> None:
    expect_refusal(live, worker_target(live, "worker-1"), CloseReason.BAD_MAGIC, "bad magic b'\\x00\\x00'",
                   payload=bytes(64))


def test_worker_refuses_client_role_on_data_port(live: Live) -> None:
    pid = "cli-" + secrets.token_hex(3)
    expect_refusal(live, worker_target(live, "worker-1"), CloseReason.BAD_HANDSHAKE, "role 'client' on a data port",
                   handshake=hello(live.cluster.token, pid, role="client"), peer=f"client {pid}")


WORKER_FRAME_CASES = {
    "data": (data_frame(999_999, 1, ["x"]), "data for unknown channel 999999"),
    "event": (frame(EVENT, msgpack.packb({"t": "end"}), channel=999_999, seq=1), "event for unknown channel 999999"),
    "credit": (frame(CREDIT, struct.pack(">I", 3), channel=999_999), "credit for unknown channel 999999"),
}


@pytest.mark.parametrize("case", list(WORKER_FRAME_CASES))
def test_worker_refuses_frame_for_unknown_channel(live: Live, case: str) -> None:
    """After a correct handshake as a worker that shares no channel with this one."""
    payload, detail = WORKER_FRAME_CASES[case]
    pid = "worker-9" + secrets.token_hex(2)
    expect_refusal(live, worker_target(live, "worker-2"), CloseReason.UNKNOWN_CHANNEL, detail,
                   handshake=hello(live.cluster.token, pid, role="worker"), payload=payload, peer=f"worker {pid}")


def _cross_worker_channel(live: Live) -> tuple[int, str, str]:
    """(channel id, producer worker, consumer worker) of a live channel of the endless job."""
    placement = {t["task"].rsplit("/", 1)[1]: t["worker"] for t in live.job()["tasks"]}
    for i in range(2):  # edge 0: source (vertex 0, parallelism 2) -hash-> counter (vertex 1, parallelism 2)
        for j in range(2):
            if placement[f"0:{i}"] != placement[f"1:{j}"]:
                return live.channel_base + i * 2 + j, placement[f"0:{i}"], placement[f"1:{j}"]
    raise AssertionError(f"no channel crosses workers: {placement}")


@pytest.mark.parametrize("kind", ["data", "event"])
def test_worker_refuses_live_channel_from_a_peer_that_does_not_produce_it(live: Live, kind: str) -> None:
    """A real channel id of the running job, sent by a peer other than its producer, is an unknown channel.

    The intruder uses its own id: reusing the producer's id would replace the producer's real link
    (runtime/network.py, _adopt) and so break the job by design.
    """
    cid, producer, consumer = _cross_worker_channel(live)
    pid = "worker-0" + secrets.token_hex(2)
    assert pid not in (producer, consumer)
    payload = (data_frame(cid, 1, [["k1", 0, 0]]) if kind == "data"
               else frame(EVENT, msgpack.packb({"t": "end"}), channel=cid, seq=1))
    expect_refusal(live, worker_target(live, consumer), CloseReason.UNKNOWN_CHANNEL,
                   f"{kind} for unknown channel {cid}", handshake=hello(live.cluster.token, pid, role="worker"),
                   payload=payload, peer=f"worker {pid}")
    for wid in ("worker-1", "worker-2"):
        assert "lost data connection" not in live.cluster.log(wid)


def test_many_bad_connections_at_once(live: Live) -> None:
    """A burst of concurrent bad peers: each is refused, the cluster does not notice."""
    target = worker_target(live, "worker-1")
    before = refused_total(target.metrics, CloseReason.BAD_MAGIC)
    socks = [socket.create_connection(target.address, timeout=IO_TIMEOUT_S) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(b"\xff" * HEADER.size)
        for s in socks:
            assert [r.type for r in parse(read_to_eof(s))] == [GOODBYE]
    finally:
        for s in socks:
            s.close()
    poll(lambda: refused_total(target.metrics, CloseReason.BAD_MAGIC) == before + 20, 10, "20 refusals counted")
    assert_still_serving(live)


def test_cluster_still_runs_a_job_to_the_end(live: Live) -> None:
    """After (or between) the bad input, a new bounded job across both workers finishes."""
    job_id = live.cluster.submit("endless_job:build_bounded")
    result = live.cluster.wait_job(job_id, timeout_s=60)
    assert result["state"] == "FINISHED", result
    assert live.job()["state"] == "RUNNING"


def test_silent_peer_is_dropped_after_the_handshake_timeout(live: Live) -> None:
    """A connection that never says hello is closed after HANDSHAKE_TIMEOUT_S (opened at module start)."""
    silent = live.silent
    silent.sock.settimeout(HANDSHAKE_TIMEOUT_S + IO_TIMEOUT_S)
    replies = parse(read_to_eof(silent.sock, HANDSHAKE_TIMEOUT_S + IO_TIMEOUT_S))
    assert time.monotonic() - silent.opened_at >= HANDSHAKE_TIMEOUT_S - 0.5
    assert [r.type for r in replies] == [GOODBYE], replies
    assert "timed out: no handshake within the timeout" in replies[0].body()["reason"]
    line = wait_log_line(live.cluster, "coordinator", silent.log_offset, "closing connection with", silent.local)
    assert f"closing connection with ? ? at {silent.local}: timed out (no handshake within the timeout)" in line
    assert refused_total(live.coordinator_metrics, CloseReason.TIMEOUT) == 1
    assert_still_serving(live)


# -- data without credit ------------------------------------------------------------------------------------


class _Gate:
    """The part of an InputGate the network touches: a ledger, and somewhere to put delivered buffers."""

    def __init__(self, channel_id: int) -> None:
        self.ledger = CreditLedger([channel_id], exclusive=2, floating=0)
        self.delivered: list[bytes] = []
        self.two_delivered = asyncio.Event()

    def deliver_data(self, channel_id: int, seq: int, buffer: Any) -> None:
        self.delivered.append(buffer.data)
        if len(self.delivered) == 2:
            self.two_delivered.set()


async def test_data_without_credit_closes_the_link(caplog: pytest.LogCaptureFixture) -> None:
    """NO_CREDIT through the real transport and NetworkEnvironment, over a real socket, in this process.

    Hitting it against a live worker needs the producer's own worker id on a channel of a running
    job, and a second link under that id replaces the producer's real link (runtime/network.py,
    _adopt), so the job would fail for reasons other than the one under test. The sans-IO rule is
    also covered by tests/unit/test_connection.py; here the socket, the GOODBYE, the log line, the
    metric counter and the data-plane callback are checked end to end.
    """
    caplog.set_level(logging.WARNING, logger="sluice.net")
    token = secrets.token_hex(8)
    cid = 77
    net = NetworkEnvironment("worker-b", token=token, host="127.0.0.1")
    gate = _Gate(cid)
    net.register_inbound(cid, "worker-a", gate)  # type: ignore[arg-type]
    assert gate.ledger.take_announcements() == {cid: 2}  # as if the two exclusive credits had been sent
    lost: list[tuple[str, str]] = []
    link_lost = asyncio.Event()

    def on_link_lost(peer: str, why: str) -> None:
        lost.append((peer, why))
        link_lost.set()

    net.on_link_lost = on_link_lost
    before = PROTOCOL_FAILURES[CloseReason.NO_CREDIT.value]
    port = await net.start(0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        host, lport = writer.get_extra_info("sockname")[:2]
        local = f"{host}:{lport}"
        writer.write(hello(token, "worker-a", role="worker"))
        head = await asyncio.wait_for(reader.readexactly(HEADER.size), IO_TIMEOUT_S)
        assert HEADER.unpack(head)[2] == HELLO_ACK
        await reader.readexactly(HEADER.unpack(head)[-1])
        writer.write(data_frame(cid, 1, ["a"]) + data_frame(cid, 2, ["b"]))
        await asyncio.wait_for(gate.two_delivered.wait(), IO_TIMEOUT_S)
        writer.write(data_frame(cid, 3, ["c"]))  # the two credits are used up
        rest = await asyncio.wait_for(reader.read(), IO_TIMEOUT_S)  # reads to EOF
        writer.close()
        replies = parse(rest)
        assert [r.type for r in replies] == [GOODBYE]
        assert "data buffer sent without credit" in replies[0].body()["reason"]
        assert f"channel {cid}" in replies[0].body()["reason"]
        await asyncio.wait_for(link_lost.wait(), IO_TIMEOUT_S)
    finally:
        await net.close()
    assert gate.delivered == [msgpack.packb("a"), msgpack.packb("b")]
    assert PROTOCOL_FAILURES[CloseReason.NO_CREDIT.value] == before + 1
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"closing connection with worker worker-a at {local}: data buffer sent without credit" in m
               for m in lines), lines
    assert lost == [("worker-a", lost[0][1])] and "data buffer sent without credit" in lost[0][1]
    assert "worker-a" not in net.links


# -- the command line ---------------------------------------------------------------------------------------


def _cli(live: Live, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], env=live.cluster.env,
                          cwd=str(live.cluster.tmp_path), capture_output=True, text=True, timeout=60)


def test_cli_rejects_bad_coordinator_address(live: Live) -> None:
    result = _cli(live, "worker", "--coordinator", "nonsense")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1], result.stderr
    assert "--coordinator" in errors[0] and "'nonsense'" in errors[0], errors


@pytest.mark.parametrize(("entry", "words"), [
    ("no_such_job_module:build", ["no_such_job_module", "ModuleNotFoundError"]),
    ("broken_job:build", ["broken_job", "sluice_dependency_that_is_not_installed"]),
    ("endless_job:no_such_function", ["endless_job", "no_such_function"]),
    ("not-an-entry-point", ["not-an-entry-point", "package.module:function"]),
])
def test_cli_submit_of_a_job_that_does_not_load(live: Live, entry: str, words: list[str]) -> None:
    jobs_before = live.cluster.call("status")["jobs"]
    result = _cli(live, "submit", "--coordinator", live.cluster.coordinator.fields["rpc"], entry)  # type: ignore
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()
    assert len(message) == 1 and message[0].startswith("sluice submit: "), result.stderr
    assert all(w in message[0] for w in words), message
    assert live.cluster.call("status")["jobs"] == jobs_before  # no job record was created
    assert live.cluster.coordinator.proc.poll() is None  # type: ignore[union-attr]
    assert_still_serving(live)
