"""Any picklable value travels between workers and into checkpoints (issue 31): datetimes, Decimals and sets in
records cross a hash edge between processes and live in keyed state; a value pickle refuses fails the job at
once, naming the operator and the type, without spending its restarts."""

from __future__ import annotations

import datetime
import decimal
import json
from collections import defaultdict
from typing import Any

import pytest

from runtime.connectors.generator import BLOCK, generate_block, key_names
from runtime.data.checkpoint_state import open_checkpoint, state_rows
from tests.support.checkpoints import checkpoint_dir
from tests.support.cluster import Cluster, committed_rows, logs, poll, write_module

pytestmark = pytest.mark.integration

WORDS, KEYS, SEED = 20_000, 50, 3
JOBS = '''
import datetime
import decimal
import threading

from runtime.api import FileSink, GeneratorSource, Job, KeyedProcessFunction

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def enrich(record):
    key, seq, _ = record
    return (key, EPOCH + datetime.timedelta(seconds=seq), decimal.Decimal(seq) / 100, frozenset({{key[:2]}}))


class Totals(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.latest = ctx.value_state("latest")
        self.total = ctx.value_state("total", default=decimal.Decimal(0))

    def process(self, record, ctx):
        key, at, amount, prefixes = record
        assert isinstance(prefixes, frozenset) and prefixes == frozenset({{key[:2]}})
        n = self.count.value() + 1
        self.count.update(n)
        latest = self.latest.value()
        self.latest.update(at if latest is None else max(latest, at))
        self.total.update(self.total.value() + amount)
        ctx.emit((key, n, self.latest.value(), self.total.value()))


def values(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .map(enrich, name="enrich")
        .key_by(lambda r: r[0])
        .process(Totals(), parallelism=2).uid("totals")
        .sink(FileSink({out!r}), parallelism=1))


def locked(record):
    return (record[0], threading.Lock()) if record[1] == 100 else (record[0], None)


def unpicklable(job: Job) -> None:
    (job.source(GeneratorSource(count=1_000_000, keys=10, seed=1), parallelism=1)
        .map(locked, name="lock_it")
        .key_by(lambda r: r[0])
        .sink(FileSink({bad!r}), parallelism=2))
'''


def test_datetimes_decimals_and_sets_cross_workers_and_checkpoints(cluster: Cluster) -> None:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "valuejobs", JOBS.format(words=WORDS, keys=KEYS, seed=SEED, out=str(out),
                                                            bad=str(cluster.tmp_path / "bad")))
    cluster.start(2)
    config = {"checkpoint": {"interval_s": 0.3, "mode": "aligned", "timeout_s": 20},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.2, "slot_wait_s": 30}}
    job_id = cluster.submit("valuejobs:values", config)
    bad_id = cluster.submit("valuejobs:unpicklable", config)
    st = cluster.wait_job(job_id, 120)
    assert st["state"] == "FINISHED", (st, logs(cluster))

    epoch = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    seqs: dict[str, list[int]] = defaultdict(list)
    for block in range(-(-WORDS // BLOCK)):
        for key, seq, _ in generate_block(block, seed=SEED, keys=key_names(KEYS), cum_weights=None, count=WORDS):
            seqs[key].append(seq)
    poll(lambda: not committed_rows(out)[1], 15, "the final commit")
    last: dict[str, list[Any]] = {}
    counts: dict[str, list[int]] = defaultdict(list)
    for line in committed_rows(out)[0].elements():
        key, n, at, total = json.loads(line)
        counts[key].append(n)
        if n == len(seqs[key]):
            last[key] = [at, decimal.Decimal(total)]
    assert {k: sorted(v) for k, v in counts.items()} == {k: list(range(1, len(v) + 1)) for k, v in seqs.items()}
    assert last == {k: [(epoch + datetime.timedelta(seconds=max(v))).isoformat(), decimal.Decimal(sum(v)) / 100]
                    for k, v in seqs.items()}
    # the final checkpoint holds the values themselves, typed, and the state processor reads them back
    cp = open_checkpoint(str(checkpoint_dir(cluster, job_id, st["final_checkpoint_id"])))
    state = {(key, name): value for key, _, name, value in state_rows(cp, "totals", "value")}
    assert {k: state[(k, "total")] for k in seqs} == {k: decimal.Decimal(sum(v)) / 100 for k, v in seqs.items()}
    assert {k: state[(k, "latest")] for k in seqs} == {
        k: epoch + datetime.timedelta(seconds=max(v)) for k, v in seqs.items()}

    bad = cluster.wait_job(bad_id, 60)
    assert bad["state"] == "FAILED" and bad["restarts"] == 0, json.dumps(bad, default=str)[:6000]
    assert "lock_it" in bad["error"] and "_thread.lock" in bad["error"] and "UnpicklableValue" in bad["error"], bad
