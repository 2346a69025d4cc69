"""A network-namespace lab: workers in their own namespaces, joined pairwise by veth links that can be cut.

    with NetnsLab(workers=2) as lab:                # needs root and `ip`; raises NetnsUnavailable otherwise
        cluster = LocalCluster(..., coordinator_host="0.0.0.0", place_worker=lab.place)
        lab.cut(0, 1)                                # the data path between worker 1 and worker 2 goes dark
        lab.heal(0, 1)

Worker i runs in namespace `<tag>-i` (via `ip netns exec`). Its data address is a /32 on its loopback,
reachable from worker j only through the veth pair (i, j): a host route names that veth. So cutting one
pair (both ends set down) silences exactly one worker-to-worker link, without an error on either socket,
while every worker keeps its own uplink veth to the root namespace, where the coordinator listens. Used by
tests/integration/test_link_cut.py and the link-cut chaos runs. Teardown always removes every namespace
and interface it made, even after a failed set-up.

`HostLab` is the other shape: N hosts on one LAN, each a namespace with its own address on a bridge in the
root namespace (which has an address on it too, for a service every host reaches, such as an object store).
Cutting host i sets its cable down, so it can reach nothing and nothing reaches it:

    with HostLab(hosts=3) as lab:                    # host 0: coordinator, hosts 1-2: workers
        start_process(..., prefix=lab.prefix(0))      # a process on host 0, binding 0.0.0.0
        lab.address(1), lab.gateway                    # 10.<octet>.1.2, and the root namespace's 10.<octet>.1.254
        lab.cut(2); lab.heal(2)
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from types import TracebackType

from runtime.cli.local_cluster import WorkerPlace


class NetnsUnavailable(RuntimeError):
    """This machine cannot create network namespaces here (not root, no `ip`, or a sandbox forbids it)."""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclass
class NetnsLab:
    workers: int = 2
    tag: str = field(default_factory=lambda: f"sl{secrets.token_hex(2)}")
    octet: int = field(default_factory=lambda: 100 + secrets.randbelow(100))  # 10.<octet>.x.y, avoids clashes
    namespaces: list[str] = field(default_factory=list)
    _root_links: list[str] = field(default_factory=list)
    cuts: dict[tuple[int, int], float] = field(default_factory=dict)  # pair -> monotonic time of the cut

    # -- addresses ----------------------------------------------------------------

    def data_address(self, i: int) -> str:
        return f"10.{self.octet}.0.{i + 1}"

    def uplink_root(self, i: int) -> str:
        return f"10.{self.octet}.{10 + i}.1"

    def _uplink_ns(self, i: int) -> str:
        return f"10.{self.octet}.{10 + i}.2"

    def _veth(self, i: int, j: int) -> str:
        """The end of pair (i, j) that lives in worker i's namespace."""
        return f"{self.tag}p{i}x{j}"

    def place(self, index: int) -> WorkerPlace:
        """Where LocalCluster starts worker `index` (it must listen on 0.0.0.0 in the root namespace)."""
        return WorkerPlace(["ip", "netns", "exec", self.namespaces[index]], self.data_address(index),
                           self.uplink_root(index))

    # -- lifecycle ----------------------------------------------------------------

    def create(self) -> NetnsLab:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
        try:
            self._create()
        except RuntimeError as exc:
            self.teardown()
            raise NetnsUnavailable(f"cannot build the namespace lab: {exc}") from None
        return self

    def _create(self) -> None:
        for i in range(self.workers):
            ns = f"{self.tag}-{i}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("addr", "add", f"{self.data_address(i)}/32", "dev", "lo", ns=ns)
            # uplink to the root namespace, for the coordinator
            root_end, ns_end = f"{self.tag}r{i}", f"{self.tag}u{i}"
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            self._root_links.append(root_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("addr", "add", f"{self.uplink_root(i)}/24", "dev", root_end)
            _ip("link", "set", root_end, "up")
            _ip("addr", "add", f"{self._uplink_ns(i)}/24", "dev", ns_end, ns=ns)
            _ip("link", "set", ns_end, "up", ns=ns)
        for i in range(self.workers):
            for j in range(i + 1, self.workers):
                a, b = self._veth(i, j), self._veth(j, i)
                _ip("link", "add", a, "netns", self.namespaces[i], "type", "veth", "peer", "name", b, "netns",
                    self.namespaces[j])
                self._bring_up(i, j)

    def _bring_up(self, i: int, j: int) -> None:
        for x, y in ((i, j), (j, i)):
            ns, dev = self.namespaces[x], self._veth(x, y)
            _ip("link", "set", dev, "up", ns=ns)
            # a link-scope host route: the peer's data address is reachable through this pair only
            _ip("route", "replace", f"{self.data_address(y)}/32", "dev", dev, "src", self.data_address(x), ns=ns)

    def cut(self, i: int, j: int) -> None:
        """Silence the link between worker i and worker j: both veth ends down, no error on any socket."""
        for x, y in ((i, j), (j, i)):
            _ip("link", "set", self._veth(x, y), "down", ns=self.namespaces[x])
        self.cuts[(min(i, j), max(i, j))] = time.monotonic()

    def heal(self, i: int, j: int) -> float:
        """Bring the pair back (routes too: a device going down drops them); returns how long it was cut."""
        self._bring_up(i, j)
        started = self.cuts.pop((min(i, j), max(i, j)), time.monotonic())
        return time.monotonic() - started

    def teardown(self) -> None:
        """Remove everything made, whatever state set-up reached; never raises."""
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)  # deletes the veths inside it, and so their peers
        for link in self._root_links:
            _ip("link", "del", link, check=False)
        self.namespaces.clear()
        self._root_links.clear()

    def __enter__(self) -> NetnsLab:
        return self.create()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()


@dataclass
class HostLab:
    """Hosts on one bridged LAN, each in its own network namespace with one address; see the module doc."""

    hosts: int = 3
    tag: str = field(default_factory=lambda: f"sh{secrets.token_hex(2)}")
    octet: int = field(default_factory=lambda: 100 + secrets.randbelow(100))  # 10.<octet>.1.0/24
    namespaces: list[str] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)  # root-namespace ends of every host's cable, and the bridge
    cuts: dict[int, float] = field(default_factory=dict)  # host -> monotonic time of the cut

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the LAN (reachable from every host that is not cut)."""
        return f"10.{self.octet}.1.254"

    def address(self, i: int) -> str:
        return f"10.{self.octet}.1.{i + 1}"

    def prefix(self, i: int) -> list[str]:
        """Run a command on host i."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def _cable(self, i: int) -> str:
        return f"{self.tag}c{i}"

    def create(self) -> HostLab:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
        try:
            self._create()
        except RuntimeError as exc:
            self.teardown()
            raise NetnsUnavailable(f"cannot build the host lab: {exc}") from None
        return self

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.hosts):
            ns = f"{self.tag}-h{i}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
            root_end, ns_end = self._cable(i), f"{self.tag}e{i}"
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            self._links.append(root_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("link", "set", root_end, "master", self.bridge)
            _ip("link", "set", root_end, "up")
            _ip("addr", "add", f"{self.address(i)}/24", "dev", ns_end, ns=ns)
            _ip("link", "set", ns_end, "up", ns=ns)

    def cut(self, i: int) -> None:
        """Unplug host i: its cable goes down, no error on any socket (peers' packets just go unanswered)."""
        _ip("link", "set", self._cable(i), "down")
        self.cuts[i] = time.monotonic()

    def heal(self, i: int) -> float:
        """Plug host i back; returns how long it was cut."""
        _ip("link", "set", self._cable(i), "up")
        return time.monotonic() - self.cuts.pop(i, time.monotonic())

    def teardown(self) -> None:
        """Remove everything made, whatever state set-up reached; never raises."""
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        for link in reversed(self._links):
            _ip("link", "del", link, check=False)
        self.namespaces.clear()
        self._links.clear()

    def __enter__(self) -> HostLab:
        return self.create()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()

