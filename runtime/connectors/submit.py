"""What a connector's submit check is told about the submission (the check itself: `check_at_submit(context)`
on a source or sink, called by runtime/graph/admission.py on the coordinator, on a thread)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SubmitContext:
    """What a connector's submit check may need to know about the submission."""

    checkpoint_interval_s: float | None = None
    restore: bool = False  # a restore goes on where the run it restores left off (prepared transactions...)
