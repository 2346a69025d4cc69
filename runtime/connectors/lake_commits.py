"""The commit protocol of the table sinks (Delta, Iceberg), without I/O: which data files a checkpoint's one
table commit adds, and which a subtask may forget.

Every subtask writes data files while a checkpoint runs and, at the barrier, lists each finished file as a
pending entry `[checkpoint, app, file]`: the checkpoint it was pre-committed in, the *application id* of the
run that wrote it (`sluice-<job id>-<sink uid>`; a job restored from another job's checkpoint has a new job
id, and its restored entries keep their old app) and the file's description. The list is the subtask's
sink state and is also written to a staging manifest next to the table (runtime/connectors/lake_staging.py).

When checkpoint K completes, one subtask (the committer, subtask 0) reads the manifests of K of every
subtask and makes ONE table commit that adds every listed file the table does not have yet, and records
per app the highest checkpoint it committed (Delta: an application transaction `txn(app, version)`; Iceberg:
the snapshot summary). The table's recorded version V of an app is the whole truth about its entries:

    an entry [c, app, file] is in the table  <=>  c <= V(app)

because a commit that records V(app) = v adds every entry of that app with c <= v still pending (they are all
in the manifests of the checkpoint being committed: a subtask keeps an entry until the table shows it, see
`still_pending`), and entries of an app are created in checkpoint order. So a commit replayed after a
restore (the checkpoint's commit happened but the job restarted from that checkpoint before anyone learned
of it) finds every one of its entries at or below V and adds nothing: it is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Entry = list[Any]  # [checkpoint id, app id, file description (a dict with at least "path")]


def app_id_of(job_id: str, uid: str) -> str:
    """The application id of one run of one sink: stable across the restarts of a job (same job id)."""
    return f"sluice-{job_id}-{uid}"


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What one table commit adds: the files (each once, in entry order) and, per app, the version to record."""

    files: tuple[dict[str, Any], ...]
    versions: tuple[tuple[str, int], ...]  # (app, highest checkpoint committed), sorted by app

    @property
    def empty(self) -> bool:
        return not self.files


def plan_commit(entries: Iterable[Entry], committed: Mapping[str, int | None], *, checkpoint_id: int,
                app_id: str) -> CommitPlan:
    """The commit of checkpoint `checkpoint_id` by the run `app_id`, given the pending entries of every
    subtask's manifest of that checkpoint and the versions the table records (`committed`, app -> V or None).

    Entries at or below their app's V are already in the table; entries after the checkpoint (none should
    be listed) wait. The current app's version becomes `checkpoint_id`; an older app's the highest checkpoint
    of its entries added now."""
    files: list[dict[str, Any]] = []
    seen: set[str] = set()
    versions: dict[str, int] = {}
    for checkpoint, app, file in entries:
        checkpoint = int(checkpoint)
        done = committed.get(app)
        if checkpoint > checkpoint_id or (done is not None and checkpoint <= done):
            continue
        if file["path"] in seen:
            continue
        seen.add(file["path"])
        files.append(file)
        versions[app] = max(versions.get(app, checkpoint), checkpoint)
    if files:
        versions[app_id] = max(checkpoint_id, versions.get(app_id, checkpoint_id))
    return CommitPlan(tuple(files), tuple(sorted(versions.items())))


# A finish marker's checkpoint for a subtask restored already finished: it takes part in no checkpoint of the
# run (checkpoint ids only grow, so every checkpoint of the run is above it).
FINISHED_BEFORE_THIS_RUN = 0


def committer_of(checkpoint_id: int, parallelism: int, finished: Mapping[int, int]) -> int | None:
    """Which subtask makes the table commit of `checkpoint_id`: the lowest-numbered one that had not finished
    before it (`finished`: subtask -> the checkpoint it took at its end of input, from the subtasks' finish
    markers of this run). A subtask that finished earlier takes no part in later checkpoints, so it cannot
    commit their files. A marker is written before its subtask acknowledges its final checkpoint (or, restored
    already finished, before its task ends: FINISHED_BEFORE_THIS_RUN), so when checkpoint K completes every
    marker at or below K is there; a marker above K, seen or not, names the same committer of K: every subtask
    names the same one. None: all had finished."""
    for subtask in range(parallelism):
        final = finished.get(subtask)
        if final is None or final >= checkpoint_id:
            return subtask
    return None


def finish_marker_name(attempt: int, subtask: int) -> str:
    """A subtask's finish marker; per attempt, since a restart runs the subtasks again from the checkpoint."""
    return f"{attempt:05d}-{subtask:05d}.json"


def finished_in_attempt(names: Iterable[str], attempt: int) -> list[tuple[int, str]]:
    """(subtask, name) of the finish markers of `attempt` among a directory's names."""
    out = []
    for name in names:
        stem, _, ext = name.partition(".")
        a, _, subtask = stem.partition("-")
        if ext == "json" and a.isdigit() and subtask.isdigit() and int(a) == attempt:
            out.append((int(subtask), name))
    return sorted(out)


def still_pending(entries: Iterable[Entry], committed: Mapping[str, int | None]) -> list[Entry]:
    """The entries the table does not hold yet (a subtask keeps these in its state and manifests)."""
    out = []
    for entry in entries:
        done = committed.get(entry[1])
        if done is None or int(entry[0]) > done:
            out.append(entry)
    return out


def apps_of(entries: Iterable[Entry]) -> list[str]:
    return sorted({str(e[1]) for e in entries})


def manifest_name(checkpoint_id: int, subtask: int) -> str:
    """A subtask's staging manifest of a checkpoint: zero-padded, so names sort by checkpoint."""
    return f"{checkpoint_id:012d}-{subtask:05d}.json"


def parse_manifest_name(name: str) -> tuple[int, int] | None:
    """(checkpoint, subtask) of a manifest name, None for any other name."""
    stem, dot, ext = name.partition(".")
    checkpoint, dash, subtask = stem.partition("-")
    if ext != "json" or not dot or not dash or not checkpoint.isdigit() or not subtask.isdigit():
        return None
    return int(checkpoint), int(subtask)


def manifests_of(names: Iterable[str], checkpoint_id: int) -> list[str]:
    """The manifests of one checkpoint among a staging directory's names, by subtask."""
    found = [(parsed[1], n) for n in names if (parsed := parse_manifest_name(n)) and parsed[0] == checkpoint_id]
    return [n for _, n in sorted(found)]


def manifests_up_to(names: Iterable[str], checkpoint_id: int) -> list[str]:
    """Manifests of checkpoints at or before `checkpoint_id` (to clean up after its commit)."""
    return sorted(n for n in names if (parsed := parse_manifest_name(n)) and parsed[0] <= checkpoint_id)
