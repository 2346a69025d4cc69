"""Job records and their lifecycle, as a transition table.

    CREATED -> DEPLOYING -> RUNNING -> FINISHING -> FINISHED   (FINISHING: every task finished, the last
                                                                 checkpoint's commit is recorded)
                  |  ^         |          |
                  v  |         v          v
               RESTARTING <----+----------+        (failure, a restart left)
    any non-terminal state -> FAILED (no restart left) | CANCELLED (by the user)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.exception_history import ExceptionHistory
from runtime.graph.enums import JobState, TaskState
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import Plan

if TYPE_CHECKING:
    from coordinator.checkpointing import CheckpointStatistics, CompletedCheckpoint
    from coordinator.load_scaler import LoadScaling

TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.CREATED: frozenset({JobState.DEPLOYING, JobState.FAILED, JobState.CANCELLED}),
    JobState.DEPLOYING: frozenset({JobState.RUNNING, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.FINISHING, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.FINISHING: frozenset({JobState.FINISHED, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RESTARTING: frozenset({JobState.DEPLOYING, JobState.FAILED, JobState.CANCELLED}),
    JobState.FINISHED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
EARLIER_CHECKPOINTS = 200  # earlier attempts' checkpoints kept in the history (they are counted all the same)


class IllegalTransition(Exception):
    pass


@dataclass(frozen=True)
class JobStatistics:
    """One job as metrics see it: a snapshot, safe to read after the record moves on."""

    job_id: str
    state: str
    terminal: bool
    checkpoints_completed: int  # over every attempt
    checkpoints_failed: int
    checkpoint: CheckpointStatistics | None  # the current attempt's checkpoint coordinator, while it runs
    restarts: int
    last_restart_s: float | None
    restored_checkpoint_id: int | None


@dataclass
class JobRecord:
    job_id: str
    entry: str
    name: str
    sys_path: str
    config: JobConfig
    state: str = JobState.CREATED
    attempt: int = 0
    plan: Plan | None = None
    error: str = ""
    submitted_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    finished_tasks: set[str] = field(default_factory=set)
    ended_tasks: set[str] = field(default_factory=set)  # reached the end of input (waiting for the final checkpoint)
    final_checkpoint_id: int | None = None  # the checkpoint whose commit ended a bounded job
    task_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoint_settings: Any = None  # coordinator.checkpointing.CheckpointSettings
    checkpoints: Any = None  # coordinator.checkpoint_runner.CheckpointRunner while running
    last_checkpoint: CompletedCheckpoint | None = None
    restored_from: str = ""
    upgrade_of: str = ""  # the job this one replaced in `sluice upgrade`: a new leader finishes that upgrade
    restart_strategy: Any = None  # coordinator.restarts.RestartStrategy
    restarts: int = 0
    failures: list[str] = field(default_factory=list)  # causes of every failure, oldest first
    last_restart_s: float | None = None  # failure detected -> running again, last restart
    restart_s: list[float] = field(default_factory=list)  # the same for every restart
    rescale_s: list[float] = field(default_factory=list)  # downtime of every `sluice rescale`: stop -> running
    restored_checkpoint_id: int | None = None
    next_checkpoint_id: int = 1
    earlier_checkpoints: list[dict[str, Any]] = field(default_factory=list)  # history of earlier attempts
    # (completed, failed) checkpoints no longer in earlier_checkpoints: trimmed away, or of a previous coordinator
    checkpoints_before: tuple[int, int] = (0, 0)
    exceptions: ExceptionHistory = field(default_factory=ExceptionHistory, repr=False, compare=False)
    # vertices (with record totals) and edges as last seen, for a job without a plan: one recovered after it ended
    saved_graph: dict[str, Any] | None = None
    # the load-based autoscaler's window, last evaluation and decisions (coordinator/load_scaler.py); not saved
    load_scaling: LoadScaling | None = field(default=None, repr=False, compare=False)
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)  # set on a terminal state
    # called after every state change: the coordinator persists the record (coordinator/job_store.py)
    on_change: Callable[[JobRecord], None] | None = field(default=None, repr=False, compare=False)

    def checkpoint_history(self) -> list[dict[str, Any]]:
        """Every attempt's checkpoints, oldest first."""
        current = [s.to_document() for s in self.checkpoints.coordinator.history()] if self.checkpoints else []
        return [*self.earlier_checkpoints, *current]

    def checkpoint_counts(self) -> tuple[int, int]:
        """(completed, failed) over every attempt."""
        done = self.checkpoints_before[0] + sum(h["status"] == "COMPLETED" for h in self.earlier_checkpoints)
        failed = self.checkpoints_before[1] + sum(h["status"] == JobState.FAILED for h in self.earlier_checkpoints)
        if self.checkpoints is not None:
            st = self.checkpoints.coordinator.statistics()
            done, failed = done + st.completed, failed + st.failed
        return done, failed

    def archive_checkpoints(self, limit: int = EARLIER_CHECKPOINTS) -> None:
        """The attempt's checkpoint runner is going: keep its history with the earlier attempts' (the last
        `limit`), counting the ones trimmed away."""
        history = self.checkpoint_history()
        dropped = history[:-limit] if len(history) > limit else []
        self.checkpoints_before = (self.checkpoints_before[0] + sum(h["status"] == "COMPLETED" for h in dropped),
                                   self.checkpoints_before[1] + sum(h["status"] == JobState.FAILED for h in dropped))
        self.earlier_checkpoints = history[-limit:]

    def complete_archived(self, summary: dict[str, Any]) -> None:
        """A checkpoint of an attempt whose runner is gone completed after its history was archived (its
        `_metadata` write was under way at the restart): its archived entry says so from now on."""
        for i, entry in enumerate(self.earlier_checkpoints):
            if entry["checkpoint_id"] == summary.get("checkpoint_id"):
                self.earlier_checkpoints[i] = {**entry, **summary}

    def note_failure(self, cause: str, *, now: float | None = None) -> None:
        """A failover begins: the cause goes to `failures` and, with its traceback, to the exception history."""
        self.failures.append(cause)
        self.exceptions.record(cause, now=time.time() if now is None else now, attempt=self.attempt)

    def statistics(self) -> JobStatistics:
        done, failed = self.checkpoint_counts()
        checkpoint = self.checkpoints.coordinator.statistics() if self.checkpoints is not None else None
        return JobStatistics(self.job_id, self.state, self.terminal, done, failed, checkpoint, self.restarts,
                             self.last_restart_s, self.restored_checkpoint_id)

    def move(self, state: str, error: str = "") -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"job {self.job_id}: {self.state} -> {state}")
        self.state = state
        if error:
            self.error = error
        if state == JobState.RUNNING:  # a failover (if one was under way) ends here: its entries learn it
            self.exceptions.restarted(now=time.time(), attempt=self.attempt,
                                      restored_checkpoint_id=self.restored_checkpoint_id)
        if state in TERMINAL:
            self.ended_at = time.time()
            self.exceptions.ended(state)
            self.ended.set()
        if self.on_change is not None:
            self.on_change(self)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def total_tasks(self) -> int:
        if self.plan is None:
            return sum(int(v["parallelism"]) for v in (self.saved_graph or {}).get("vertices", []))
        return sum(v.parallelism for v in self.plan.vertices)

    def graph_snapshot(self) -> dict[str, Any] | None:
        """Vertices with their record totals and the edges: what a job's page shows once the plan is gone."""
        if self.plan is None:
            return self.saved_graph
        vertices = []
        for v in self.plan.vertices:
            stats = [self.task_stats.get(f"{self.job_id}/{v.id}:{i}") or {} for i in range(v.parallelism)]
            vertices.append({"id": v.id, "name": v.name, "parallelism": v.parallelism,
                             "records_in": sum(int(s.get("records_in", 0)) for s in stats),
                             "records_out": sum(int(s.get("records_out", 0)) for s in stats)})
        return {"vertices": vertices,
                "edges": [{"from": e.up, "to": e.down, "partitioner": e.partitioner} for e in self.plan.edges]}

    def task_view(self, stats: dict[str, Any] | None) -> dict[str, Any] | None:
        """A task's last reported figures as status shows them: an ended job runs nothing, so a task last seen
        running was stopped with it (an upgrade's old version, a cancel) and shows so."""
        if stats is None or not self.terminal or stats.get("state") in (
                TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED):
            return stats
        stopped = TaskState.FAILED if self.state == JobState.FAILED else TaskState.CANCELLED
        return {**stats, "state": str(stopped)}

    def last_checkpoint_document(self) -> dict[str, Any] | None:
        return self.last_checkpoint.to_document() if self.last_checkpoint is not None else None

    @property
    def last_checkpoint_id(self) -> int | None:
        return self.last_checkpoint.checkpoint_id if self.last_checkpoint is not None else None

    def summary(self) -> dict[str, Any]:
        # without each task's rate window (the points its rates are computed from, not a figure): over half of a
        # 1,000-task answer, which `sluice status` and scripts/bench_scale.py (deploy: every 0.25 s) read
        tasks = [self.task_view({k: v for k, v in t.items() if k != "window"})
                 for t in sorted(self.task_stats.values(), key=lambda t: t["task"])]
        return {
            "job_id": self.job_id, "name": self.name, "entry": self.entry, "state": self.state,
            "attempt": self.attempt, "error": self.error, "submitted_at": self.submitted_at,
            "ended_at": self.ended_at, "tasks_total": self.total_tasks(), "tasks_finished": len(self.finished_tasks),
            "tasks": tasks, "last_checkpoint": self.last_checkpoint_document(), "restored_from": self.restored_from,
            "restarts": self.restarts, "failures": self.failures[-10:], "last_restart_s": self.last_restart_s,
            "restart_s": self.restart_s[-50:], "rescale_s": self.rescale_s[-50:],
            "restored_checkpoint_id": self.restored_checkpoint_id, "final_checkpoint_id": self.final_checkpoint_id,
            "checkpoints_completed": self.checkpoint_counts()[0], "checkpoints_failed": self.checkpoint_counts()[1],
            "vertices": [{"id": v["id"], "name": v["name"], "parallelism": v["parallelism"]}
                         for v in (self.graph_snapshot() or {}).get("vertices", [])],
            "placement": dict(self.plan.placement) if self.plan else {},
        }
