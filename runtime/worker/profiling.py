"""A worker's profile of itself, without running anything: py-spy's command line, its collapsed stacks parsed,
attributed to threads and tasks and cut to a reply's size, and the one line that says why a profile failed.

py-spy samples a Python process from outside (it reads the interpreter's memory), so the worker's code is not
instrumented and keeps serving while it is profiled. `record --format raw --threads` writes one line per
distinct stack, root first, with its sample count: `thread (0x7F..): sluice-task job/1:0;run (isolation.py:88);
... 12`. Every task runs its records on a thread named after it (runtime/execution/isolation.py), so a stack's
thread names its task; the event loop (links, credit, checkpoints, and the tasks of asynchronous operators)
runs on MainThread. Idle threads (waiting on a lock or a socket) are not sampled, so the graph shows where
CPU time goes. runtime/worker/profiler.py runs py-spy; this module is what is tested without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from runtime.execution.isolation import TASK_THREAD_PREFIX

RATE_HZ = 100  # samples a second, py-spy's default
MAX_STACK_CHARS = 2 * 1024 * 1024  # the stacks of one reply, at most (an RPC frame holds 4 MiB)
MAX_FRAME_CHARS = 300  # a frame's text is cut past this (a lambda's or a generated name can be long)

_THREAD_FRAME = re.compile(r"^thread \((0x[0-9A-Fa-f]+|\d+)\)(?::\s*(.*))?$")


@dataclass(frozen=True, slots=True)
class Stack:
    thread: str  # the thread's name ("" when py-spy gave none: its id then)
    frames: tuple[str, ...]  # root first, the thread's own frame left out
    samples: int

    @property
    def task(self) -> str | None:
        """The task whose thread this stack ran on (its `job/vertex:subtask` id), None for other threads."""
        return task_of_thread(self.thread)

    def to_wire(self) -> list[object]:
        """[thread, task or None, "frame;frame;...", samples]: the form the `profile` reply carries."""
        return [self.thread, self.task, ";".join(self.frames), self.samples]

    def chars(self) -> int:
        return len(self.thread) + sum(len(f) + 1 for f in self.frames) + 16


def task_of_thread(thread: str) -> str | None:
    return thread[len(TASK_THREAD_PREFIX):] if thread.startswith(TASK_THREAD_PREFIX) else None


def py_spy_command(executable: str, pid: int, seconds: int, output: str, *, rate_hz: int = RATE_HZ) -> list[str]:
    """py-spy recording `pid` for `seconds` into `output` as collapsed stacks, each rooted at its thread.
    --nonblocking: py-spy reads the stacks without stopping the worker's threads at every sample (a stack may
    now and then be read mid-change; the worker's latency is worth more than that sample)."""
    return [executable, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate_hz),
            "--format", "raw", "--threads", "--nonblocking", "--output", output]


def parse_collapsed(text: str) -> list[Stack]:
    """py-spy's raw output -> stacks, most samples first (ties by text, so the order is the same every time).
    Lines that are not `stack count` are skipped; the same stack twice is summed."""
    counts: dict[tuple[str, tuple[str, ...]], int] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = ""
        match = _THREAD_FRAME.match(frames[0])
        if match is not None:
            thread = (match.group(2) or "").strip() or match.group(1)
            frames = frames[1:]
        key = (thread, tuple(f[:MAX_FRAME_CHARS] for f in frames))
        counts[key] = counts.get(key, 0) + int(count)
    return sorted((Stack(thread, frames, n) for (thread, frames), n in counts.items()),
                  key=lambda s: (-s.samples, s.thread, s.frames))


def bounded(stacks: Iterable[Stack], max_chars: int = MAX_STACK_CHARS) -> tuple[list[Stack], int]:
    """The stacks that fit in `max_chars`, most samples first, and the samples of those left out (the graph
    loses its thinnest flames, never its widest)."""
    kept: list[Stack] = []
    used = dropped = 0
    for stack in sorted(stacks, key=lambda s: -s.samples):
        size = stack.chars()
        if used + size > max_chars:
            dropped += stack.samples
            continue
        kept.append(stack)
        used += size
    return kept, dropped


PTRACE_HINT = ("no permission to read the worker's memory (ptrace): run the worker with CAP_SYS_PTRACE (a "
               "container: --cap-add SYS_PTRACE) or set the sysctl kernel.yama.ptrace_scope to 0 or 1")


def failure_line(returncode: int | None, stderr: str) -> str:
    """One line saying why py-spy gave no profile, from its exit status and what it wrote to stderr."""
    text = stderr.strip()
    lowered = text.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered or "sys_ptrace" in lowered:
        return f"py-spy could not profile the worker: {PTRACE_HINT}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # py-spy prints `Error: ...` and then a `Reason: ...` per cause: the first says what failed
    reason = next((line for line in lines if line.startswith("Error:")), lines[-1] if lines else "")
    status = "no exit status" if returncode is None else f"exit status {returncode}"
    return f"py-spy could not profile the worker ({status}): {reason[:300] or 'it wrote no reason'}"
