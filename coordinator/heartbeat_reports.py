"""The coordinator's side of a worker's heartbeat task entries (runtime/worker/heartbeat_reports.py): the last
whole report of every task the worker runs, rebuilt from whole reports and changes, without I/O.

One `ReportMirror` per registered worker (a new registration starts a new one, and the worker starts again with
whole reports). `apply(whole, changes)` returns the tasks' whole reports, what the heartbeat handler has always
handed on (task_sample, the REST API, metrics, the autoscaler), so every reader sees the same figures whether
the worker sent deltas or not. A task the heartbeat does not name has ended on that worker and is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.graph.protocol import task_report_key


@dataclass
class Applied:
    reports: list[dict[str, Any]]  # whole reports, in the heartbeat's order: whole ones first, then changed
    without_base: list[tuple[Any, Any, Any]] = field(default_factory=list)  # changes for a task it did not hold


class ReportMirror:
    def __init__(self) -> None:
        self._reports: dict[tuple[Any, Any, Any], dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._reports)

    def apply(self, whole: list[Mapping[str, Any]], changes: list[Mapping[str, Any]]) -> Applied:
        held: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        out = Applied([])
        for report in whole:
            key = task_report_key(report)
            held[key] = dict(report)
            out.reports.append(held[key])
        for change in changes:
            key = task_report_key(change)
            base = self._reports.get(key)
            if base is None:  # not held (see runtime/worker/heartbeat_reports.py FULL_EVERY): skipped until whole
                out.without_base.append(key)
                continue
            held[key] = {**base, **change}
            out.reports.append(held[key])
        self._reports = held
        return out
