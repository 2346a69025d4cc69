"""The keyed word count of the failover tests and what checks it: a job module (`failjobs`) with jobs that
fail in chosen ways, a cluster of named workers to run it, the worker-kill and restart steps, and the check
that the committed output counts every record exactly once."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, generator_counts, kill_worker, poll, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

# Count is chained with its sink (same parallelism, forward), so the vertex "Count -> <sink>" hosts both.
# `once(name)` is true exactly once per test, across processes and attempts (O_EXCL on a marker file), which is
# how a job fails "only in the first attempt" without knowing its attempt.
JOBS = '''
import json
import os
import signal

from runtime.api import FileSink, GeneratorSource, Job, KeyedProcessFunction

OUT = {out!r}
MARKERS = {markers!r}
WORDS, KEYS, SEED = {words}, {keys}, {seed}
SINK_DELAY = {sink_delay}
FAIL_SEQ = {fail_seq}


def once(name, content=""):
    try:
        fd = os.open(os.path.join(MARKERS, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    return True


from runtime.examples.wordcount import Count  # the README's keyed word count

RELEASE = {release!r}
''' + RELEASABLE_SINK + '''


class FailOnce(Count):
    def process(self, record, ctx):
        if record[1] == FAIL_SEQ and once("raised"):
            raise RuntimeError(f"injected failure at record {{FAIL_SEQ}}")
        super().process(record, ctx)


class AlwaysFail(Count):
    def process(self, record, ctx):
        if record[1] == FAIL_SEQ:
            raise RuntimeError("injected permanent failure")
        super().process(record, ctx)


class CrashingSink(ReleasableSink):
    """Kills its own worker at two precise points of the two-phase protocol.

    in flight: attempt 0, subtask 1, at the first pre-commit after a checkpoint has completed: the files are
    pending for a checkpoint that can never complete (this task never acknowledges it).
    before commit: attempt 1, subtask 0, when told that a checkpoint with pending files completed, before
    publishing any of them: the restore must redo that commit.
    """

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self._committed = False

    def snapshot_state(self, checkpoint_id):
        state = super().snapshot_state(checkpoint_id)
        if (self.attempt == 0 and self.subtask_index == 1 and self._committed
                and any(p[0] == checkpoint_id for p in self._pending)
                and once("crash-in-flight", json.dumps({{"checkpoint_id": checkpoint_id, "pid": os.getpid()}}))):
            os.kill(os.getpid(), signal.SIGKILL)
        return state

    def commit(self, checkpoint_id):
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        if (self.attempt == 1 and self.subtask_index == 0 and due
                and once("crash-before-commit", json.dumps({{"checkpoint_id": checkpoint_id, "pid": os.getpid(),
                                                            "files": [p[2] for p in due]}}))):
            os.kill(os.getpid(), signal.SIGKILL)
        self._committed = True
        super().commit(checkpoint_id)


def _pipeline(job, count, sink, count_group=None):
    counted = (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=2)
               .key_by(lambda r: r[0])
               .process(count, parallelism=2))
    if count_group is not None:
        counted.slot_sharing_group(count_group)
    counted.sink(sink)


def wordcount(job: Job) -> None:
    _pipeline(job, Count(), ReleasableSink(OUT, delay_per_record_s=SINK_DELAY))


def wordcount_grouped(job: Job) -> None:
    """The count and its sink in a slot sharing group of their own: on other slots than the source's."""
    _pipeline(job, Count(), ReleasableSink(OUT, delay_per_record_s=SINK_DELAY), count_group="count")


def fail_once(job: Job) -> None:
    _pipeline(job, FailOnce(), ReleasableSink(OUT, delay_per_record_s=SINK_DELAY))


def always_fail(job: Job) -> None:
    _pipeline(job, AlwaysFail(), ReleasableSink(OUT, delay_per_record_s=SINK_DELAY))


def crashing_sink(job: Job) -> None:
    _pipeline(job, Count(), CrashingSink(OUT, delay_per_record_s=SINK_DELAY))
'''

KEYS, SEED = 100, 3
CHANNELS = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4}
WORKER_ARGS = ("--heartbeat-interval", "0.25s")


class Setup:
    def __init__(self, cluster: Cluster, words: int) -> None:
        self.cluster = cluster
        self.words = words
        self.out = cluster.tmp_path / "out"
        self.markers = cluster.tmp_path / "markers"
        self.markers.mkdir()
        self.replaced: set[int] = set()

    def submit(self, entry: str, *, checkpoint: dict[str, Any] | None = None,
               restart: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> str:
        """Submit `failjobs:<entry>` with unaligned checkpoints every 0.5 s and fixed-delay restarts (`checkpoint`
        and `restart` override single settings; `extra` adds other config, e.g. a state backend)."""
        config: dict[str, Any] = {**CHANNELS, **(extra or {})}
        config["checkpoint"] = {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3,
                                **(checkpoint or {})}
        config["restart"] = {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60,
                             **(restart or {})}
        return self.cluster.submit(f"failjobs:{entry}", config)

    def status(self, job_id: str) -> dict[str, Any]:
        return dict(self.cluster.call("status", {"job_id": job_id}))

    def logs(self) -> str:
        names = ["coordinator", *sorted({worker_id_of(w) for w in self.cluster.workers})]
        return "\n".join(f"--- {n}\n{self.cluster.log(n)[-4000:]}" for n in names)

    def replace_dead_workers(self) -> list[str]:
        """Start a worker with the same id for every worker process that died (once each)."""
        started = []
        for w in list(self.cluster.workers):
            if w.proc.poll() is not None and w.pid not in self.replaced:
                self.replaced.add(w.pid)
                wid = worker_id_of(w)
                self.cluster.start_worker(*WORKER_ARGS, worker_id=wid)
                started.append(wid)
        return started

    def wait_finished(self, job_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
        try:
            st = self.cluster.wait_job(job_id, timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstatus {self.status(job_id)}\n{self.logs()}") from None
        assert st["state"] == "FINISHED", f"{st}\n{self.logs()}"
        return st


def worker_id_of(w: Any) -> str:
    """The id a managed worker process announced in its readiness line."""
    return str(w.fields["id"])


def install(cluster: Cluster, *, words: int, sink_delay: float = 0.00005, fail_seq: int = -1) -> Setup:
    setup = Setup(cluster, words)
    write_module(cluster.tmp_path, "failjobs",
                 JOBS.format(out=str(setup.out), markers=str(setup.markers), words=words, keys=KEYS, seed=SEED,
                             sink_delay=sink_delay, fail_seq=fail_seq, release=release_path(cluster)))
    return setup


def expected_counts(words: int) -> Counter[str]:
    counts = generator_counts(words, KEYS, SEED)
    assert sum(counts.values()) == words
    return counts


def part_order(path: Path) -> tuple[int, int]:
    # part-<subtask>-<checkpoint>-<attempt>-<n>.jsonl: n counts on over the subtask's files, in write order
    _, subtask, _checkpoint, _attempt, n = path.name.split(".")[0].split("-")
    return int(subtask), int(n)


def assert_exact_output(setup: Setup) -> None:
    """Committed output counts every input record exactly once; nothing hidden is left behind."""
    files = sorted(setup.out.iterdir()) if setup.out.exists() else []
    hidden = [p.name for p in files if p.name.startswith((".", "_"))]
    assert hidden == [], f"uncommitted files left behind: {hidden}"
    counts: dict[str, list[int]] = defaultdict(list)
    for path in sorted(files, key=part_order):
        for line in path.read_text().splitlines():
            key, n = json.loads(line)
            counts[key].append(n)
    expected = expected_counts(setup.words)
    assert set(counts) == set(expected), sorted(set(counts) ^ set(expected))
    wrong = {}
    for key, n in expected.items():
        if counts[key] != list(range(1, n + 1)):
            got = Counter(counts[key])
            wrong[key] = {"expected": n, "got": len(counts[key]),
                          "duplicated": sorted(c for c, m in got.items() if m > 1)[:10],
                          "missing": sorted(set(range(1, n + 1)) - set(got))[:10],
                          "in_order": counts[key] == sorted(counts[key])}
    assert not wrong, f"{len(wrong)} keys wrong, e.g. {dict(list(wrong.items())[:3])}"
    assert sum(len(v) for v in counts.values()) == setup.words


def sink_placement(status: dict[str, Any]) -> dict[int, str]:
    """Subtask index of the sink vertex -> the worker that reported it."""
    out = {}
    for t in status["tasks"]:
        if "Sink" in t["name"]:
            out[int(t["task"].rsplit(":", 1)[1])] = t["worker"]
    return out


def wait_first_checkpoint(setup: Setup, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        found.update(st)
        return st["last_checkpoint"] is not None and len(sink_placement(st)) == 2

    poll(done, timeout_s, "a completed checkpoint and sink statistics")
    return found


def assert_recovered(st: dict[str, Any], restarts: int) -> None:
    assert st["restarts"] == restarts, st
    assert st["attempt"] == restarts, st
    assert st["error"] == "", st
    assert st["last_restart_s"] is not None and 0 < st["last_restart_s"] < 60, st
    assert len(st["failures"]) == restarts, st


def start(cluster: Cluster, workers: int = 3, *coordinator_args: str) -> None:
    cluster.start(workers, *coordinator_args, worker_args=WORKER_ARGS, worker_ids=True)


def kill_worker_running(cluster: Cluster, status: dict[str, Any], sink_subtask: int) -> str:
    """SIGKILL the worker that runs sink subtask `sink_subtask` in `status`; returns its id once it is dead
    (`restart_worker` starts it again under that id)."""
    victim_id = sink_placement(status)[sink_subtask]
    kill_worker(cluster, victim_id)
    return victim_id


def restart_worker(cluster: Cluster, worker_id: str) -> None:
    cluster.start_worker(*WORKER_ARGS, worker_id=worker_id)


def kill_once_and_recover(setup: Setup, job_id: str, sink_subtask: int = 0, *,
                          finish_timeout_s: float = 90.0) -> dict[str, Any]:
    """The kill -9 flow: once a checkpoint has completed, SIGKILL the worker running sink subtask `sink_subtask`
    (and the Count subtask chained with it, its state and its backend's local files), start it again under its
    id. The job must finish after exactly one restart, from that checkpoint or a later one, with exact output.
    Returns the final status."""
    st = wait_first_checkpoint(setup, job_id)
    killed_after = st["last_checkpoint"]["checkpoint_id"]
    victim_id = kill_worker_running(setup.cluster, st, sink_subtask)
    restart_worker(setup.cluster, victim_id)
    release(setup.cluster)  # the restored attempt at full speed: the restore, not the data, is under test
    st = setup.wait_finished(job_id, finish_timeout_s)
    assert_recovered(st, 1)
    assert victim_id in st["failures"][0], st
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= killed_after, st
    assert_exact_output(setup)
    return st


def committed_by(setup: Setup) -> list[int]:
    """The checkpoint ids in the committed part files' names (part-<subtask>-<checkpoint>-<attempt>-<n>)."""
    return sorted(int(p.name.split("-")[2]) for p in setup.out.iterdir() if p.name.startswith("part-"))


def own_segments(metadata: dict[str, Any], checkpoint_id: int) -> list[str]:
    """The channel-state segments (`shared/chan-...`) a checkpoint's `_metadata` lists that this checkpoint wrote
    itself: no earlier checkpoint references them, so damaging one leaves the checkpoint before intact."""
    from runtime.common.retention import segment_writer

    names = {str(entry[0]) for ack in metadata["acks"].values() for entry in (ack.get("state") or {}).get("segments")
             or ()}
    return sorted(n for n in names if segment_writer(n) == checkpoint_id)


def fall_back_from_a_corrupt_latest_checkpoint(setup: Setup, job_id: str, corrupt: Callable[[str], str]) -> None:
    """Two manual checkpoints 10k records apart while the job (manual checkpoints only) runs; `corrupt(path)`
    damages a state file of the second (its path) and returns the file's name; the worker of sink subtask 0 is
    killed and replaced. The restart must skip the second, saying so in the coordinator's log with the file's
    name, restore the first, and leave exact output."""
    cluster = setup.cluster
    seen = {"records": 0}

    def flowing(at_least: int) -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), st
        seen["records"] = sum(t["records_in"] for t in st["tasks"])
        return len(st["tasks"]) == 4 and seen["records"] >= at_least

    poll(lambda: flowing(10_000), 60, "records to flow")
    first = cluster.call("checkpoint", {"job_id": job_id})
    assert first["status"] == "COMPLETED", first
    more = seen["records"] + 10_000  # once: the lambda would move the mark on every poll
    poll(lambda: flowing(more), 60, "more records after the first checkpoint")
    second = cluster.call("checkpoint", {"job_id": job_id})
    assert second["status"] == "COMPLETED", second
    poll(lambda: second["checkpoint_id"] in committed_by(setup), 30, "the second checkpoint's commit")
    assert setup.status(job_id)["state"] == "RUNNING", "the job must still run for this test"

    damaged = corrupt(second["path"])
    kill_worker(cluster, sink_placement(setup.status(job_id))[0])
    setup.replace_dead_workers()
    release(cluster)  # the restored attempt at full speed: the restore, not the data, is under test
    st = setup.wait_finished(job_id, 180)
    assert st["restarts"] == 1, st
    assert st["restored_checkpoint_id"] == first["checkpoint_id"], st
    log = cluster.log("coordinator")
    assert f"skipping checkpoint {second['path']}" in log and damaged in log, log[-3000:]
    assert_exact_output(setup)
