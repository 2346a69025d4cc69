"""The worker's profiler: runs py-spy on the worker's own process for a few seconds, one profile at a time, and
answers with the collapsed stacks (parsed and bounded by runtime/worker/profiling.py).

Refusals say why in one line, and the worker keeps serving whatever happens: a request outside 1..30 s
(BadProfileRequest), a profile already running (ProfileInProgress), py-spy missing or unable to read the
process (ProfilerUnavailable: not installed, no ptrace permission). py-spy runs as a child of the worker; on a
kernel whose Yama ptrace scope is 1 (a process may trace only its descendants), the worker declares its
descendants allowed to trace it (PR_SET_PTRACER) for the profile's duration, so no privilege is needed there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from netstack.errors import Conflict, InvalidRequest
from runtime.graph.protocol import PROFILE_SECONDS
from runtime.worker.profiling import RATE_HZ, Stack, bounded, failure_line, parse_collapsed, py_spy_command

log = logging.getLogger("sluice.worker.profiler")

START_GRACE_S = 15.0  # py-spy's own start and the writing of its output, beyond the seconds it samples
PR_SET_PTRACER = 0x59616D61  # linux/prctl.h


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (a virtualenv's bin/, where the `profile` extra installs it), or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def not_installed_line() -> str:
    return ("py-spy is not installed on this worker: pip install 'sluice-dataflow[profile]' (or pip install "
            "py-spy) where the worker runs")


@dataclass(frozen=True, slots=True)
class Profile:
    seconds: int
    rate_hz: int
    stacks: list[Stack]  # most samples first, bounded to fit one reply
    samples: int  # every sample taken, those of the stacks left out too
    dropped_samples: int


class Profiler:
    def __init__(self, *, executable: str | None, pid: int | None = None, rate_hz: int = RATE_HZ) -> None:
        self.executable = executable  # None: py-spy is not installed (every request gets the line that says so)
        self.pid = os.getpid() if pid is None else pid
        self.rate_hz = rate_hz
        self.busy = False

    async def record(self, seconds: int) -> Profile:
        low, high = PROFILE_SECONDS
        if not low <= seconds <= high:
            raise InvalidRequest(f"a profile lasts {low} to {high} seconds, not {seconds}", "BadProfileRequest")
        if self.busy:
            raise Conflict("this worker is being profiled already: one profile at a time", "ProfileInProgress")
        if self.executable is None:
            raise Conflict(not_installed_line(), "ProfilerUnavailable")
        self.busy = True
        log.info("py-spy profiles this worker for %d s", seconds)
        try:
            text = await self._run(self.executable, seconds)
        finally:
            self.busy = False
        # a long profile of a busy worker is megabytes of text: parsed off the event loop
        return await asyncio.to_thread(self._digest, seconds, text)

    def _digest(self, seconds: int, text: str) -> Profile:
        stacks = parse_collapsed(text)
        kept, dropped = bounded(stacks)
        return Profile(seconds, self.rate_hz, kept, sum(s.samples for s in stacks), dropped)

    async def _run(self, executable: str, seconds: int) -> str:
        with tempfile.TemporaryDirectory(prefix="sluice-profile-") as directory:
            output = os.path.join(directory, "stacks.txt")
            command = py_spy_command(executable, self.pid, seconds, output, rate_hz=self.rate_hz)
            with _traceable_by_descendants():
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                        stderr=asyncio.subprocess.PIPE)
                except OSError as exc:  # not there (any more), or not executable
                    raise Conflict(f"{not_installed_line()} ({exc.strerror or exc})", "ProfilerUnavailable") from None
                try:
                    _, stderr = await asyncio.wait_for(proc.communicate(), seconds + START_GRACE_S)
                except BaseException as exc:  # timed out, or the call was cancelled: py-spy must not outlive it
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
                    if isinstance(exc, TimeoutError):
                        raise Conflict(f"py-spy did not finish within {seconds + START_GRACE_S:.0f} s of a "
                                       f"{seconds} s profile; stopped", "ProfilerUnavailable") from None
                    raise
            text = await asyncio.to_thread(_read, output) if proc.returncode == 0 else None
            if text is None:
                line = failure_line(proc.returncode, stderr.decode(errors="replace"))
                log.warning("%s", line)
                raise Conflict(line, "ProfilerUnavailable")
            return text


def _read(path: str) -> str | None:
    """py-spy's output, or None when it wrote none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _traceable_by_descendants() -> Iterator[None]:
    """While py-spy runs: under Yama's ptrace scope 1, let this process's descendants (py-spy) trace it. Linux
    only; where there is no Yama (EINVAL) or no libc, nothing changes and nothing is needed or possible."""
    prctl = _prctl()
    allowed = prctl is not None and prctl(PR_SET_PTRACER, os.getpid(), 0, 0, 0) == 0
    try:
        yield None
    finally:
        if allowed and prctl is not None:
            prctl(PR_SET_PTRACER, 0, 0, 0, 0)


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):
        return None
