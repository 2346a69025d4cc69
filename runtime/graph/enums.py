"""Names shared by the coordinator and the workers. StrEnums: on the wire and in files they are the same
plain strings as before, so nothing that reads them changes."""

from __future__ import annotations

from enum import StrEnum


class CheckpointMode(StrEnum):
    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    ALIGNED_TIMEOUT = "aligned_timeout"  # aligned, switching to unaligned at a deadline
    AT_LEAST_ONCE = "at_least_once"


CHECKPOINT_MODES = tuple(m.value for m in CheckpointMode)


class JobState(StrEnum):
    CREATED = "CREATED"
    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    FINISHING = "FINISHING"  # every task finished; publishing the sinks' final files
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class TaskState(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"
