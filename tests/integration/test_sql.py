"""Flink SQL on a real cluster (runtime/sql): `sluice sql FILE.sql` runs a statement set (a HOP window aggregation
and an unbounded GROUP BY into an upsert table) whose committed output equals Spark SQL's over the same input; a
TUMBLE window and an interval join in one job with a worker killed -9 mid-run commit exactly what the queries
mean."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from runtime.cli.processes import child_env
from runtime.sql.types import format_timestamp
from tests.support.cluster import Cluster
from tests.support.event_time_kill import assert_committed_exactly, run_killed

pytestmark = pytest.mark.integration
pytest.importorskip("sqlglot")

T0 = 1_600_000_000_000
ROWS = 6_000

SCRIPT = """
SET 'parallelism.default' = '2';
SET 'execution.checkpointing.interval' = '1s';
CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, date_time TIMESTAMP(3),
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = 'bids', 'format' = 'json');
CREATE TABLE hop_out (auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), bids BIGINT,
  total BIGINT, top BIGINT, avg_price BIGINT, bidders BIGINT
) WITH ('connector' = 'filesystem', 'path' = 'hop_out', 'format' = 'json');
CREATE TABLE per_channel (channel STRING, bids BIGINT, total BIGINT, PRIMARY KEY (channel) NOT ENFORCED)
  WITH ('connector' = 'filesystem', 'path' = 'per_channel', 'format' = 'json');
EXECUTE STATEMENT SET BEGIN
INSERT INTO hop_out
SELECT auction, window_start, window_end, COUNT(*), SUM(price), MAX(price), AVG(price), COUNT(DISTINCT bidder)
FROM TABLE(HOP(TABLE bids, DESCRIPTOR(date_time), INTERVAL '5' SECOND, INTERVAL '10' SECOND))
WHERE price > 100
GROUP BY auction, window_start, window_end;
INSERT INTO per_channel SELECT UPPER(channel), COUNT(*), SUM(price) FROM bids GROUP BY UPPER(channel);
END;
"""


def write_bids(directory: Path) -> None:
    """Two files of bids 10 ms apart, each up to 3 s behind its place (the watermark allows 4 s: none is late);
    `ms` (not a column of the table) is the event time for Spark."""
    rng = random.Random(7)
    directory.mkdir()
    files = [open(directory / f"part-{i}.json", "w") for i in range(2)]  # noqa: SIM115 - closed below
    for i in range(ROWS):
        ms = T0 + i * 10 - rng.randint(0, 3000)
        row = {"auction": rng.randint(0, 30), "bidder": rng.randint(0, 50), "price": rng.randint(1, 1000),
               "channel": rng.choice(["web", "app", "Web", None]), "date_time": format_timestamp(ms), "ms": ms}
        files[i * 2 // ROWS].write(json.dumps(row) + "\n")
    for f in files:
        f.close()


def committed(directory: Path) -> list[dict[str, Any]]:
    """The committed lines of a FileSink directory, per subtask in commit order (part-<subtask>-<checkpoint>-...)."""
    def order(p: Path) -> tuple[int, ...]:
        _, subtask, checkpoint, attempt, n = p.name.split(".")[0].split("-")
        return int(subtask), int(checkpoint), int(attempt), int(n)
    parts = sorted((p for p in directory.iterdir() if p.name.startswith("part-")), key=order)
    assert not [p for p in directory.iterdir() if p.name.startswith(".")], "in-progress files left"
    return [json.loads(line) for p in parts for line in p.read_text().splitlines()]


def test_sql_statement_set_on_a_local_cluster_equals_spark_sql(tmp_path: Path, spark: Any) -> None:
    write_bids(tmp_path / "bids")
    (tmp_path / "q.sql").write_text(SCRIPT)
    env = child_env("sql-test-token", None)
    env.pop("SLUICE_TOKEN")
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "sql", "q.sql", "--workers", "2"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job FINISHED" in proc.stdout

    bids = spark.read.json(str(tmp_path / "bids"))
    bids.createOrReplaceTempView("sql_test_bids")
    hop = spark.sql("""
        SELECT auction, w AS window_start, w + 10000 AS window_end, COUNT(*) AS bids, SUM(price) AS total,
               MAX(price) AS top, CAST(SUM(price) DIV COUNT(price) AS BIGINT) AS avg_price,
               COUNT(DISTINCT bidder) AS bidders
        FROM (SELECT *, EXPLODE(ARRAY(FLOOR(ms / 5000) * 5000, FLOOR(ms / 5000) * 5000 - 5000)) AS w
              FROM sql_test_bids WHERE price > 100)
        GROUP BY auction, w""").collect()
    expected_hop = Counter(json.dumps([r["auction"], format_timestamp(int(r["window_start"])),
                                       format_timestamp(int(r["window_end"])), r["bids"], r["total"], r["top"],
                                       r["avg_price"], r["bidders"]]) for r in hop)
    got_hop = Counter(json.dumps(list(r.values())) for r in committed(tmp_path / "hop_out"))
    assert got_hop == expected_hop, (sum((got_hop - expected_hop).values()), sum((expected_hop - got_hop).values()))

    channels = spark.sql("SELECT UPPER(channel) AS channel, COUNT(*) AS bids, SUM(price) AS total "
                         "FROM sql_test_bids GROUP BY UPPER(channel)").collect()
    changes = committed(tmp_path / "per_channel")
    final: dict[Any, Any] = {}
    ops: dict[Any, list[str]] = defaultdict(list)
    for change in changes:  # an upsert table: the last change of a key is its value
        key = change["data"]["channel"]
        final[key] = change["data"]
        ops[key].append(change["op"])
    assert final == {r["channel"]: {"channel": r["channel"], "bids": r["bids"], "total": r["total"]}
                     for r in channels}
    assert all(o[0] == "+I" and set(o[1:]) <= {"+U"} for o in ops.values()), ops
    assert sum(len(o) for o in ops.values()) == ROWS  # every bid changed its channel's row once


KILL_ROWS, KILL_RATE = 18_000, 6_000

KILL_SCRIPT = """
SET 'parallelism.default' = '2';
CREATE TABLE bids (auction BIGINT, price BIGINT, date_time TIMESTAMP(3),
  WATERMARK FOR date_time AS date_time - INTERVAL '1' SECOND
) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'rows-per-second' = '{rate}',
  'fields.auction.min' = '0', 'fields.auction.max' = '20', 'fields.price.min' = '1', 'fields.price.max' = '100',
  'fields.date_time.start-ms' = '{t0}', 'fields.date_time.step-ms' = '7');
CREATE TABLE counts (auction BIGINT, window_start TIMESTAMP(3), bids BIGINT, total BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'json');
CREATE TABLE pairs (auction BIGINT, t1 TIMESTAMP(3), t2 TIMESTAMP(3))
  WITH ('connector' = 'filesystem', 'path' = '{pairs}', 'format' = 'json');
EXECUTE STATEMENT SET BEGIN
INSERT INTO counts
SELECT auction, window_start, COUNT(*), SUM(price)
FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(date_time), INTERVAL '2' SECOND))
GROUP BY auction, window_start, window_end;
INSERT INTO pairs
SELECT b1.auction, b1.date_time, b2.date_time FROM bids AS b1, bids AS b2
WHERE b1.auction = b2.auction
  AND b2.date_time BETWEEN b1.date_time - INTERVAL '14' MILLISECOND AND b1.date_time + INTERVAL '14' MILLISECOND;
END;
"""


def test_a_window_and_a_join_query_killed_mid_run_commit_exact_output(cluster: Cluster, tmp_path: Path) -> None:
    from runtime.api import Job
    from runtime.sql.connectors import DatagenSource
    from runtime.sql.entry import entry_for

    out, pairs = tmp_path / "counts", tmp_path / "pairs"
    script = KILL_SCRIPT.format(rows=KILL_ROWS, rate=KILL_RATE, t0=T0, out=str(out), pairs=str(pairs))
    # the model: every row datagen makes (it is deterministic), counted per auction and 2 s window, and joined
    # with every row of its auction at most 14 ms away (itself too)
    scratch = Job("model")
    scratch.sql(script)
    source = next(n.payload for n in scratch.nodes if n.kind == "source").inner
    assert isinstance(source, DatagenSource)
    totals: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    times: dict[int, list[int]] = defaultdict(list)
    for subtask in range(2):
        source.open(subtask, 2)
        source.rate = None
        while (batch := source.read_batch(4096)) is not None:
            for auction, price, ms in batch:
                entry = totals[(auction, ms - ms % 2000)]
                entry[0] += 1
                entry[1] += price
                times[auction].append(ms)
    expected = Counter(json.dumps({"auction": a, "window_start": format_timestamp(w), "bids": c, "total": s},
                                  separators=(",", ":")) for (a, w), (c, s) in totals.items())
    joined: Counter[str] = Counter()
    for auction, stamps in times.items():
        stamps.sort()
        for t1 in stamps:
            for t2 in stamps[bisect_left(stamps, t1 - 14):bisect_right(stamps, t1 + 14)]:
                joined[json.dumps({"auction": auction, "t1": format_timestamp(t1), "t2": format_timestamp(t2)},
                                  separators=(",", ":"))] += 1
    assert sum(joined.values()) > KILL_ROWS  # rows of an auction 7 or 14 ms apart join beside the row itself

    def checkpointed_and_counting(job_id: str, status: dict[str, Any]) -> bool:
        history = cluster.call("checkpoints", {"job_id": job_id})["history"]
        window = [t for t in status["tasks"] if "WindowAggregate" in t["name"]]
        return any(h["status"] == "COMPLETED" for h in history) and any(t["records_in"] > 0 for t in window)

    run_killed(cluster, entry_for(script), 8 * 1024, checkpointed_and_counting, "WindowAggregate",
               what="a completed checkpoint with the window aggregation under way")
    assert_committed_exactly({"window rows": (out, expected), "interval join rows": (pairs, joined)})
