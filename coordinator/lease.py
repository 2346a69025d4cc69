"""One leading coordinator per state directory: a lease of numbered epoch files, taken with link(2).

    <state_dir>/leader/epoch-<n>     {"epoch", "holder", "address", "host", "pid", "renewals"}

The holder of the highest epoch is the leader. It rewrites its own file every
`renew_s` (write_atomically: rename over it, so a reader sees the old or the
new version), bumping `renewals`. A contender that sees the highest epoch's
file unchanged for `lease_s` of its own monotonic clock takes the next epoch:
it writes its record to a temporary file and hard-links it to
`epoch-<n+1>`; link(2) fails with EEXIST if the name exists, so of several
contenders exactly one wins, and the file never exists half-written. The
epoch is the fencing token: a leader that finds `epoch-<n+1>` has lost.

Safety (at most one coordinator acts as leader at any instant) rests on two
things: the contender waits `lease_s` after the last change *it observed*,
which happened after the leader started that renewal; and the leader acts only
until `renew started + lease_s * VALID_FRACTION` on its own monotonic clock.
With clocks that run at about the same rate (no wall-clock agreement is
needed) the leader's validity ends before any contender may take over.
A leader that cannot renew in time stops acting and exits.

Renewals run on a thread of their own, not on the event loop: a coordinator whose loop is busy (deploying a
thousand tasks on a loaded machine starved it for more than the lease) still leads, as a ZooKeeper client's
session heartbeat thread keeps its session. A loop that stops turning for `loop_stall_s` is a dead leader all
the same: the thread then stops renewing and a standby takes over. A paused process (SIGSTOP) pauses both.
Needs a filesystem
with atomic rename and link (local disks, most cluster filesystems; not every
NFS setup). Docs: docs/ARCHITECTURE.md, "Coordinator failover".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from runtime.common.files import fsync_directory, write_atomically

log = logging.getLogger("sluice.lease")

LEASE_DIR = "leader"
VALID_FRACTION = 0.8  # of lease_s after the start of a renewal: the margin covers the time a write takes
_EPOCH = re.compile(r"epoch-(\d+)")


class LeaseHeld(Exception):
    """Another coordinator leads this state directory and renews its lease."""


@dataclass(frozen=True)
class LeaseRecord:
    epoch: int
    holder: str
    address: str
    host: str
    pid: int
    renewals: int = 0

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord | None:
        """None for a file that is not a lease record (being replaced, damaged): it counts as a change."""
        try:
            doc = json.loads(data)
            return cls(int(doc["epoch"]), str(doc["holder"]), str(doc["address"]), str(doc["host"]),
                       int(doc["pid"]), int(doc["renewals"]))
        except (ValueError, KeyError, TypeError):
            return None


class StaleWatch:
    """Whether the lease went unrenewed for `lease_s`, as this process saw it. Pure: give it the time."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._seen: tuple[int, str, int] | None = None
        self._since: float | None = None
        self.changes = 0  # renewals or takeovers seen after the first look: someone is alive

    def observe(self, record: LeaseRecord | None, now: float) -> bool:
        """True once the same record has been seen unchanged for lease_s. An unreadable record (being
        replaced) counts as unchanged: a live leader's next renewal is a change anyway."""
        if record is None:
            return self._since is not None and now - self._since >= self.lease_s
        key = (record.epoch, record.holder, record.renewals)
        if key != self._seen:
            if self._seen is not None:
                self.changes += 1
            self._seen, self._since = key, now
            return False
        assert self._since is not None
        return now - self._since >= self.lease_s


def host_identity() -> str:
    """This host and PID namespace: two containers may share a host name (host networking) but not pids."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{namespace}"


def holder_is_dead_here(record: LeaseRecord) -> bool:
    """The holder ran on this host, in our PID namespace, and its process is gone: no need to wait its lease out."""
    if record.host != host_identity() or record.pid <= 0:
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaseDir:
    """The lease files; blocking I/O, called through a thread."""

    def __init__(self, state_dir: str) -> None:
        self.directory = os.path.join(os.path.abspath(state_dir), LEASE_DIR)

    def _path(self, epoch: int) -> str:
        return os.path.join(self.directory, f"epoch-{epoch}")

    def epochs(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_EPOCH.fullmatch, names) if m)

    def current(self) -> tuple[int, LeaseRecord | None]:
        """The highest epoch (0 if none) and its record (None if unreadable right now)."""
        epochs = self.epochs()
        if not epochs:
            return 0, None
        try:
            with open(self._path(epochs[-1]), "rb") as f:
                return epochs[-1], LeaseRecord.decode(f.read())
        except FileNotFoundError:
            return epochs[-1], None

    def try_take(self, record: LeaseRecord) -> bool:
        """Create epoch-<record.epoch> holding `record`, unless it exists: link(2) is atomic and exclusive."""
        os.makedirs(self.directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".take-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(record.encode())
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self._path(record.epoch))
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_directory(self.directory)
        return True

    def renew(self, record: LeaseRecord) -> None:
        # not fsynced: a renewal only has to be seen by contenders while this process lives (a power cut ends
        # the leader too, and the epoch file itself was made durable when it was taken). An fsync waits behind
        # every other writer's dirty data: on a busy disk it took longer than the lease, and a lone coordinator
        # gave up leading a cluster nobody else could lead.
        write_atomically(self._path(record.epoch), record.encode(), durable=False)

    def superseded(self, epoch: int) -> bool:
        return os.path.exists(self._path(epoch + 1))

    def prune(self, below: int) -> None:
        """Remove the files of epochs before `below` (kept: the two latest, for the record)."""
        for epoch in self.epochs():
            if epoch < below:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(epoch))


class Leadership:
    """This coordinator's side of the lease: wait for it, hold it, know when it is lost."""

    def __init__(self, state_dir: str, *, holder: str, address: str, lease_s: float = 15.0,
                 renew_s: float = 1.0, loop_stall_s: float | None = None) -> None:
        if not 0 < renew_s * 2 <= lease_s:
            raise ValueError(f"the lease ({lease_s}s) must be at least twice the renewal interval ({renew_s}s)")
        # how long the event loop may stay blocked before the renewing thread gives the lease up
        self.loop_stall_s = loop_stall_s if loop_stall_s is not None else max(30.0, lease_s * 6)
        self._loop_seen = 0.0  # monotonic time the event loop last showed it turns
        self.files = LeaseDir(state_dir)
        self.holder = holder
        self.address = address
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.record: LeaseRecord | None = None  # ours, once leading
        self.leader: LeaseRecord | None = None  # the last leader seen while waiting
        self._valid_until = 0.0

    @property
    def epoch(self) -> int:
        return self.record.epoch if self.record else 0

    def valid(self) -> bool:
        """Leading, and sure no one else can be: checked before every write and every answer."""
        return self.record is not None and time.monotonic() < self._valid_until

    def leader_address(self) -> str:
        return self.leader.address if self.leader else "unknown"

    def _mine(self, epoch: int) -> LeaseRecord:
        return LeaseRecord(epoch, self.holder, self.address, host_identity(), os.getpid())

    async def acquire(self, *, standby: bool) -> None:
        """Return once this coordinator leads. Without `standby`, raise LeaseHeld if another coordinator is seen
        renewing its lease (a second coordinator started by mistake on the same state directory)."""
        watch = StaleWatch(self.lease_s)
        poll_s = self.renew_s / 2
        while True:
            started = time.monotonic()
            epoch, record = await asyncio.to_thread(self.files.current)
            if record is not None:
                self.leader = record
            stale = watch.observe(record, time.monotonic()) if epoch else True
            if record is not None and not stale and holder_is_dead_here(record):
                stale = True
            if not standby and watch.changes and record is not None:
                raise LeaseHeld(f"coordinator {record.holder} at {record.address} leads state directory "
                                f"{os.path.dirname(self.files.directory)} (lease epoch {record.epoch}); "
                                "start this one with --standby to take over when it fails")
            if stale:
                mine = self._mine(epoch + 1)
                if await asyncio.to_thread(self.files.try_take, mine):
                    self.record = mine
                    self.leader = mine
                    self._valid_until = started + self.lease_s * VALID_FRACTION
                    log.info("leading the state directory (lease epoch %d)", mine.epoch)
                    await asyncio.to_thread(self.files.prune, mine.epoch - 1)
                    return
                log.info("another coordinator took lease epoch %d first", mine.epoch)
                watch = StaleWatch(self.lease_s)
            await asyncio.sleep(poll_s)

    async def hold(self) -> str:
        """Renew every renew_s while leading; return why leadership was lost (then nothing may act).

        The renewals run on a thread (`_renew_until_lost`); this coroutine marks that the loop turns and waits
        for the thread's verdict. Cancelling it stops the renewals."""
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[str] = loop.create_future()

        def settle(why: str) -> None:
            if not lost.done():
                lost.set_result(why)

        def report(why: str) -> None:  # on the renewing thread
            loop.call_soon_threadsafe(settle, why)

        stop = threading.Event()
        self._loop_seen = time.monotonic()
        threading.Thread(target=self._renew_until_lost, args=(stop, report), name="sluice-lease",
                         daemon=True).start()
        try:
            while not lost.done():
                self._loop_seen = time.monotonic()
                await asyncio.wait({lost}, timeout=self.renew_s / 2)
            return lost.result()
        finally:
            stop.set()

    def _renew_until_lost(self, stop: threading.Event, report: Callable[[str], None]) -> None:
        """The renewing thread. A renewal counts only if it completed while the previous one was still valid:
        a leader whose validity ran out (paused, a slow disk) never extends it again, since a contender may
        already have taken over."""
        stalled_logged = False
        previous = time.monotonic()
        while not stop.wait(self.renew_s):
            started = time.monotonic()
            mine = self.record
            if mine is None:
                return
            try:
                if self.files.superseded(mine.epoch):
                    self._step_down()
                    report(f"lease epoch {mine.epoch + 1} was taken by another coordinator")
                    return
                stalled = started - self._loop_seen > self.loop_stall_s
                if stalled and not stalled_logged:
                    log.error("the event loop has not turned for %.1fs: no longer renewing the lease",
                              started - self._loop_seen)
                    stalled_logged = True
                if started < self._valid_until and not stalled and not stop.is_set():
                    renewed = LeaseRecord(**{**asdict(mine), "renewals": mine.renewals + 1})
                    self.files.renew(renewed)
                    _warn_if_slow(started, previous, self.renew_s, self.lease_s)
                    previous = started
                    if time.monotonic() < self._valid_until:
                        self.record = renewed
                        self._valid_until = started + self.lease_s * VALID_FRACTION
            except OSError as exc:
                log.error("cannot renew the lease: %s", exc)
            if time.monotonic() >= self._valid_until:
                self._step_down()
                report(self._why_lapsed(mine.epoch))
                return

    def _why_lapsed(self, epoch: int) -> str:
        """Why a lease that ran out did: a pause that lasted past a renewal already begun (SIGSTOP, a slow fsync)
        may have let a contender take the next epoch, and that is the cause to name."""
        try:
            if self.files.superseded(epoch):
                return f"lease epoch {epoch + 1} was taken by another coordinator"
        except OSError:
            pass
        return f"the lease was not renewed within {self.lease_s * VALID_FRACTION:.1f}s"

    def _step_down(self) -> None:
        self._valid_until = 0.0  # first: valid() turns false before the record goes
        self.record = None


def _warn_if_slow(started: float, previous: float, renew_s: float, lease_s: float) -> None:
    """One line when a renewal began late or took long (a quarter of the lease or more): the lease runs out
    when they add up, and the line says which it was (a starved process, a slow disk)."""
    late, took = started - previous - renew_s, time.monotonic() - started
    if max(late, took) >= lease_s / 4:
        log.warning("lease renewal began %.1fs late and took %.1fs (the lease is %.0fs)", late, took, lease_s)
