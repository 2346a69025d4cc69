"""A job that changes, on a real cluster: `sluice upgrade` stops version 1 with a savepoint and starts version 2
from it. Version 2 adds a keyed operator, renames the count (its uid kept; its node id changes and lands on the
removed operator's) and removes a stateful operator, which is refused until --allow-non-restored-state. The
committed output is exact: every key's counts 1..N once across both versions, and the added operator counts
from 1 (it started empty, not with the removed operator's state)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from netstack.errors import RpcError
from tests.support.checkpoints import checkpoint_config, read_metadata
from tests.support.cluster import Cluster, generator_counts, logs, poll, sluice, write_module

WORDS, KEYS, SEED = 12_000, 40, 5

JOBS = """
from runtime.api import DiscardSink, FileSink, GeneratorSource, Job, KeyedProcessFunction
from runtime.examples.wordcount import Count

OUT = {out!r}


def source(job):
    return job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}, records_per_second=3000),
                      parallelism=2).uid("src")


class Audit(KeyedProcessFunction):
    # state the count must never see: 1000 per record
    def open(self, ctx):
        self.total = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        self.total.update(self.total.value() + 1000)


class Since(KeyedProcessFunction):
    # added in version 2: counts from its own start
    def open(self, ctx):
        self.seen = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        s = self.seen.value() + 1
        self.seen.update(s)
        ctx.emit([record[0], record[1], s])


def v1(job: Job) -> None:
    src = source(job)
    src.key_by(lambda r: r[0]).process(Audit(), name="Audit").uid("audit").sink(DiscardSink()).uid("audit-out")
    (src.key_by(lambda r: r[0]).process(Count(), name="Count").uid("count")
        .sink(FileSink(OUT)).uid("out"))


def v2(job: Job) -> None:
    (source(job).key_by(lambda r: r[0]).process(Count(), name="Counter").uid("count")
        .key_by(lambda r: r[0]).process(Since(), name="Since")
        .sink(FileSink(OUT)).uid("out"))
"""


def committed(out: Path) -> tuple[list[list[object]], list[str]]:
    rows, hidden = [], []
    for path in sorted(out.iterdir()) if out.exists() else []:
        if path.name.startswith((".", "_")):
            hidden.append(path.name)
        else:
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows, hidden


@pytest.mark.integration
def test_upgrade_adds_renames_and_removes_operators_with_exact_output(running_cluster: Cluster) -> None:
    cluster = running_cluster
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "evolvejobs", JOBS.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED))
    config = checkpoint_config("aligned", timeout_s=30.0, interval_s=0.3)
    job = str(cluster.call("submit", {"entry": "evolvejobs:v1", "name": "evolve", "sys_path": str(cluster.tmp_path),
                                      "config": config})["job_id"])
    poll(lambda: committed(out)[0], 60, "version 1 to commit output")

    with pytest.raises(RpcError) as refused:  # the removed operator keeps state: refused, version 1 runs on
        cluster.call("upgrade", {"job_id": job, "entry": "evolvejobs:v2", "sys_path": str(cluster.tmp_path)})
    assert "Audit (uid 'audit', keyed_process)" in str(refused.value), refused.value
    assert "--allow-non-restored-state" in str(refused.value)
    assert cluster.call("status", {"job_id": job})["state"] == "RUNNING"

    upgraded = sluice(cluster, "upgrade", job, "evolvejobs:v2", "--allow-non-restored-state")
    assert upgraded.returncode == 0, (upgraded.stdout, upgraded.stderr, logs(cluster))
    assert "downtime" in upgraded.stdout, upgraded.stdout
    new = upgraded.stdout.split(" upgraded to ")[1].split()[0]
    savepoint = upgraded.stdout.split(" from savepoint ")[1].split()[0]
    operators = {op["uid"]: op for op in read_metadata(savepoint)["operators"]}
    assert (operators["count"]["name"], operators["count"]["node"]) == ("Count", 3)  # node 1 is now Counter's
    assert cluster.call("status", {"job_id": job})["state"] == "CANCELLED"
    final = cluster.wait_job(new, timeout_s=120)
    assert final["state"] == "FINISHED", (final, logs(cluster))

    poll(lambda: not committed(out)[1], 15, "the final commit (no in-progress files left)")
    rows, _ = committed(out)
    counts: dict[str, list[int]] = defaultdict(list)
    since: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        counts[str(row[0])].append(int(row[1]))  # type: ignore[call-overload]
        if len(row) == 3:
            since[str(row[0])].append((int(row[1]), int(row[2])))  # type: ignore[call-overload]
    expected = generator_counts(WORDS, KEYS, SEED)
    assert {k: sorted(v) for k, v in counts.items()} == {k: list(range(1, n + 1)) for k, n in expected.items()}
    assert since and len(since) < len(rows), "the upgrade did not happen mid-way"
    for key, pairs in since.items():  # the added operator started empty: 1, 2, ... from its first record
        first = min(n for n, _ in pairs)
        assert sorted(pairs) == [(first + i, i + 1) for i in range(len(pairs))], key
