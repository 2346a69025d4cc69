"""What a worker's heartbeat says about its tasks: each task's report with only the fields that changed since the
last heartbeat the coordinator answered (its name, state, attempt, connector figures and most queue figures
stay the same from one second to the next; only its counters and clock move).

`ReportDeltas` is the worker's side, without I/O: `entries(reports)` gives a heartbeat's task entries (whole
reports for tasks the coordinator does not hold yet, changes for the others) and holds the reports as pending,
`confirmed()` makes them the base of the next heartbeat once the coordinator answered, `reset()` (a heartbeat
failed, or a new registration) makes the next heartbeat carry whole reports. The coordinator's side, applying
entries onto the reports it holds, is coordinator/heartbeat_reports.py.

Every entry names its task (TASK_IDENTITY: job, task, attempt), so the heartbeat still lists every task the worker
runs: a task missing from it has ended there. Every `full_every` heartbeats carry whole reports whatever the
base, so a coordinator that lost a base (it should not: a new coordinator means a new registration) has it back
within that many seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.graph.protocol import TASK_IDENTITY, task_report_key

FULL_EVERY = 60  # heartbeats (about a minute) between two that carry whole reports


def changed_fields(base: Mapping[str, Any] | None, report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report's identity and the fields whose value differs from `base`; None when a delta cannot say it
    (no base, or a field the base has that the report lacks): the whole report goes then."""
    if base is None or any(k not in report for k in base):
        return None
    entry = {k: report[k] for k in TASK_IDENTITY if k in report}
    for k, v in report.items():
        if k not in entry and (k not in base or base[k] != v):
            entry[k] = v
    return entry


@dataclass(frozen=True)
class TaskEntries:
    """A heartbeat's task entries: `whole` reports (replace what the coordinator holds) and `changes` (applied
    onto it). Together they name every task the worker runs."""

    whole: list[dict[str, Any]]
    changes: list[dict[str, Any]]


class ReportDeltas:
    """A worker's heartbeat task entries: whole reports the first time, then only what changed (see module)."""

    def __init__(self, *, full_every: int = FULL_EVERY) -> None:
        self.full_every = full_every
        self._base: dict[tuple[Any, Any, Any], Mapping[str, Any]] = {}  # what the coordinator holds
        self._pending: dict[tuple[Any, Any, Any], Mapping[str, Any]] = {}  # what the heartbeat in flight says
        self._since_full = 0  # heartbeats since the last one of whole reports

    def entries(self, reports: list[dict[str, Any]]) -> TaskEntries:
        """The heartbeat's entries for these reports (every task the worker runs)."""
        self._pending = {task_report_key(rep): rep for rep in reports}
        if not self._base or self._since_full + 1 >= self.full_every:
            self._since_full = 0
            return TaskEntries([dict(rep) for rep in reports], [])
        self._since_full += 1
        whole, changes = [], []
        for rep in reports:
            entry = changed_fields(self._base.get(task_report_key(rep)), rep)
            if entry is None:
                whole.append(dict(rep))
            else:
                changes.append(entry)
        return TaskEntries(whole, changes)

    def confirmed(self) -> None:
        """The coordinator answered the heartbeat: it holds the reports it carried."""
        self._base, self._pending = self._pending, {}

    def reset(self) -> None:
        """The coordinator may not hold what the heartbeats said (one failed, or the worker registered anew)."""
        self._base, self._pending = {}, {}
        self._since_full = 0
