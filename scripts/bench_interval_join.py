#!/usr/bin/env python
"""Interval join: Sluice against Flink 2.3 SQL's own interval join, over the same input files, in one session.

Input (written once into --data-dir, reused while its manifest matches): per side --records JSON objects
`{"k": key, "seq": seq, "ts": event time ms}`, seq 0..N-1, the event time 1_700_000_000_000 + seq, the key a
fixed hash of seq over --keys keys, other hashes on the two sides (the records of scripts/bench_joins.py); for a
run at parallelism p, in p JSON-lines files per side (seq s in file s mod p, each file in event-time order), named
so that Sluice's source subtask j reads file j and Flink's readers take one file each: every source subtask
reads, and the readers advance together in event time (watermarks with no delay lose nothing). A left record l
and a right record r join when their keys are equal and l.ts + --lower <= r.ts <= l.ts + --upper; the expected
number of pairs is counted here (per key, by bisection) and every run's output count is checked against it.

Jobs, each at each --parallelism (every operator):
- sluice: FileSource (json, bounded) -> map to (k, seq, ts) -> key_by(k).interval_join(key_by(k))
  .between(lower, upper).process(emit (k, l.seq, r.seq)) -> DiscardSink (chained), watermarks
  BoundedOutOfOrderness(0) with granularity --grain-ms; on a fresh local cluster of 2 workers with 2 slots.
- sluice-grouped: the sluice job with the join and its sink in a slot sharing group of their own
  (`.slot_sharing_group("join")`): the two sources' parsing run in one worker process, the join in the other
  (without it every operator's subtask i shares slot i, so at p=1 the whole job runs in one process).
- sluice-split: as sluice-grouped, and each side's source (with its map) in a group of its own too: 3 slots
  per parallelism, so at p=1 only (the cluster has 4).
- sluice-sql: the same files and join as SQL (`job.sql`, runtime/sql: a filesystem json table per side with
  `WATERMARK FOR ts AS ts`, the join's BETWEEN, a blackhole table); its sources send watermarks periodically,
  every 200 ms of wall-clock time as Flink's (the SQL default, `pipeline.auto-watermark-interval`).
- flink-sql: Flink 2.3 SQL through PyFlink's TableEnvironment, the planner's Java interval join
  (scripts/flink_interval_join_sql_job.py; its mini cluster starts with the process).
- flink-coprocess (--coprocess-records > 0): scripts/flink_interval_join_job.py, PyFlink's Python
  KeyedCoProcessFunction doing Flink's IntervalJoinOperator algorithm, on the same records generated in the job
  (NumberSequenceSource; no files), at --coprocess-records per side: it runs at a few thousand records/s.

Times: Sluice from the submit call to FINISHED (status polled every 50 ms), with deployment (submit to every task
running) reported apart; Flink its job's net run time (submission to end inside the mini cluster: scheduling and
deployment in it; the JVM's start and the SQL planning not). Start-up: the same job over --startup-records per
side, its median time; "steady" rates = (records - startup records) / (time - start-up time). Records/s count both
sides. Median and slowest of --repeat runs, the engines alternating; the 1-minute load average (os.getloadavg)
is recorded before every run.

    .venv/bin/python scripts/bench_interval_join.py --flink-python FLINK_VENV/bin/python --records 1000000 \\
        --parallelism 1,2 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from operator import itemgetter
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import BoundedOutOfOrderness, DiscardSink, FileSource, Job  # noqa: E402

T0 = 1_700_000_000_000
LEFT_HASH, RIGHT_HASH = (2654435761, 0), (40503, 17)  # bench_joins' SeqSource and flink_interval_join_job's
ENV = "SLUICE_BENCH_INTERVAL_JOIN"  # JSON settings for the job, set before the cluster starts (inherited)


# -- input -------------------------------------------------------------------------------------------------


def key_of(seq: int, keys: int, hashing: tuple[int, int]) -> str:
    return f"k{(seq * hashing[0] + hashing[1]) % keys:03d}"


def expected_pairs(records: int, keys: int, lower: int, upper: int) -> int:
    """Pairs of the join over the two sides: per key, the right side's event times sorted, ranges by bisection."""
    right: dict[str, list[int]] = {}
    for seq in range(records):
        right.setdefault(key_of(seq, keys, RIGHT_HASH), []).append(T0 + seq)  # in order: sorted already
    pairs = 0
    for seq in range(records):
        stamps = right.get(key_of(seq, keys, LEFT_HASH), [])
        ts = T0 + seq
        pairs += bisect.bisect_right(stamps, ts + upper) - bisect.bisect_left(stamps, ts + lower)
    return pairs


def part_names(files: int) -> list[str]:
    """Names for `files` files of a side such that Sluice's FileSource at parallelism `files` gives file j to
    subtask j (crc32 of the name mod p: runtime/connectors/file_source.py)."""
    names = []
    for j in range(files):
        n = 0
        while zlib.crc32(f"part-{j}-{n}.json".encode()) % files != j:
            n += 1
        names.append(f"part-{j}-{n}.json")
    return names


def write_inputs(directory: str, records: int, keys: int, lower: int, upper: int, files: int) -> dict[str, Any]:
    """The two sides' files under `directory` (left/, right/; `files` per side, seq s in file s mod `files`, so
    parallel readers advance together in event time), reused when its manifest says the same."""
    manifest_path = os.path.join(directory, "manifest.json")
    wanted = {"records": records, "keys": keys, "lower": lower, "upper": upper, "files": files}
    if os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            manifest: dict[str, Any] = json.load(f)
        if {k: manifest.get(k) for k in wanted} == wanted:
            return manifest
    for side, hashing in (("left", LEFT_HASH), ("right", RIGHT_HASH)):
        shutil.rmtree(os.path.join(directory, side), ignore_errors=True)
        os.makedirs(os.path.join(directory, side))
        for j, name in enumerate(part_names(files)):
            with open(os.path.join(directory, side, name), "w", encoding="utf-8") as f:
                f.writelines(f'{{"k":"{key_of(seq, keys, hashing)}","seq":{seq},"ts":{T0 + seq}}}\n'
                             for seq in range(j, records, files))
    manifest = {**wanted, "pairs": expected_pairs(records, keys, lower, upper)}
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return manifest


# -- the Sluice jobs (built in the cluster's processes from ENV) --------------------------------------------------


def settings() -> dict[str, Any]:
    return dict(json.loads(os.environ.get(ENV, "{}")))


def _row(record: dict[str, Any]) -> tuple[str, int, int]:
    return record["k"], record["seq"], record["ts"]


def _pair(left: Any, right: Any, ctx: Any) -> None:
    ctx.emit((left[0], left[1], right[1]))


def build(job: Job) -> None:
    """The DataStream job (module docstring)."""
    _build(job, join_group=None)


def build_grouped(job: Job) -> None:
    """The DataStream job with the join and its sink in a slot sharing group of their own: the sources' parsing
    and the join run in different worker processes."""
    _build(job, join_group="join")


def build_split(job: Job) -> None:
    """As build_grouped, and each side's source in a group of its own too (three slots at p=1)."""
    _build(job, join_group="join", side_groups=True)


def _build(job: Job, *, join_group: str | None, side_groups: bool = False) -> None:
    s = settings()
    p = s["parallelism"]
    timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=itemgetter("ts"), granularity_ms=s["grain_ms"])
    sides = []
    for side in ("left", "right"):
        source = job.source(FileSource(s[side], format="json", bounded=True), name=side, parallelism=p,
                            watermarks=timed)
        if side_groups:
            source.slot_sharing_group(side)  # its map follows it
        sides.append(source.map(_row, name=f"{side}-rows", parallelism=p))
    left, right = sides
    first = itemgetter(0)
    joined = (left.key_by(first).interval_join(right.key_by(first)).between(s["lower"], s["upper"])
              .process(_pair, parallelism=p, name="interval-join"))
    if join_group is not None:
        joined.slot_sharing_group(join_group)
    joined.sink(DiscardSink(), parallelism=p, name="discard")


def build_sql(job: Job) -> None:
    """The SQL job: the same files and join as Flink's (flink_interval_join_sql_job.py), in Sluice's SQL."""
    s = settings()
    p = s["parallelism"]
    tables = "\n".join(f"""
        CREATE TABLE {name} (k STRING, seq BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)
        WITH ('connector' = 'filesystem', 'path' = '{s[side]}', 'format' = 'json');"""
                       for name, side in (("l", "left"), ("r", "right")))
    job.sql(f"""
        SET 'parallelism.default' = '{p}';
        {tables}
        CREATE TABLE out_rows (k STRING, lseq BIGINT, rseq BIGINT) WITH ('connector' = 'blackhole');
        INSERT INTO out_rows SELECT l.k, l.seq, r.seq FROM l, r WHERE l.k = r.k
            AND r.ts BETWEEN l.ts + INTERVAL '{s['lower']}' MILLISECOND AND l.ts + INTERVAL '{s['upper']}' MILLISECOND;
    """)


ENTRIES = {"sluice": "bench_interval_join:build", "sluice-grouped": "bench_interval_join:build_grouped",
           "sluice-split": "bench_interval_join:build_split",
           "sluice-sql": "bench_interval_join:build_sql"}


# -- runs ------------------------------------------------------------------------------------------------------


def sluice_run(engine: str, job_settings: dict[str, Any], records: int, timeout_s: float) -> dict[str, Any]:
    """One run on a fresh local cluster: seconds from submit to FINISHED, deployment apart, pairs out."""
    from runtime.cli.local_cluster import LocalCluster

    os.environ[ENV] = json.dumps(job_settings)
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-interval-join-")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir)

    async def measure() -> dict[str, Any]:
        await cluster.wait_workers()
        load = os.getloadavg()[0]
        submitted = time.monotonic()
        job_id = (await cluster.call("submit", {"entry": ENTRIES[engine], "name": f"bench-{engine}", "config": {},
                                                "sys_path": SCRIPTS}))["job_id"]
        running: float | None = None
        deadline = submitted + timeout_s
        while time.monotonic() < deadline:
            st = await cluster.call("status", {"job_id": job_id})
            now = time.monotonic()
            if st["state"] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"{engine}: job {st['state']}: {st.get('error')}")
            if running is None and len(st["tasks"]) == st["tasks_total"] and st["tasks"] and \
                    all(t["state"] in ("running", "finished") for t in st["tasks"]):
                running = now
            if st["state"] == "FINISHED":
                seconds = now - submitted
                final = time.monotonic() + 10.0  # the last task statistics come with the last heartbeats
                while not (len(st["tasks"]) == st["tasks_total"]
                           and all(t["state"] == "finished" for t in st["tasks"])) and time.monotonic() < final:
                    await asyncio.sleep(0.1)
                    st = await cluster.call("status", {"job_id": job_id})
                pairs = sum(t["records_out"] for t in st["tasks"] if "discard" in t["name"] or "out_rows" in t["name"])
                return {"engine": engine, "records": 2 * records, "seconds": seconds,
                        "deploy_s": (running or now) - submitted, "pairs": pairs, "load": load}
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{engine}: the run did not finish within {timeout_s} s")

    try:
        cluster.start()
        return asyncio.run(measure())
    finally:
        cluster.stop()


def flink_run(python: str, script: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    done = subprocess.run([python, os.path.join(SCRIPTS, script), *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{script} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(lines[-1])
    doc["load"] = load
    if "net_runtime_s" in doc:
        doc["seconds"] = doc["net_runtime_s"]
    return doc


def one_run(engine: str, args: argparse.Namespace, p: int, records: int, data: str) -> dict[str, Any]:
    left, right = os.path.join(data, "left"), os.path.join(data, "right")
    if engine in ENTRIES:
        return sluice_run(engine, {"left": left, "right": right, "lower": args.lower, "upper": args.upper,
                                   "parallelism": p, "grain_ms": args.grain_ms}, records, args.timeout)
    if engine == "flink-sql":
        return flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                         ["--left", left, "--right", right, "--lower", str(args.lower), "--upper", str(args.upper),
                          "--records", str(records), "--parallelism", str(p)], args.timeout)
    doc = flink_run(args.flink_python, "flink_interval_join_job.py",
                    ["--mode", "throughput", "--records", str(records), "--keys", str(args.keys), "--lower",
                     str(args.lower), "--upper", str(args.upper), "--parallelism", str(p)], args.timeout)
    return doc


def summary(runs: list[dict[str, Any]], startup: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["records"] / r["seconds"] for r in runs]
    out = {"median_records_per_s": statistics.median(rates), "slowest_records_per_s": min(rates),
           "median_s": statistics.median(r["seconds"] for r in runs), "loads": [round(r["load"], 2) for r in runs]}
    if startup:
        start_s = statistics.median(r["seconds"] for r in startup)
        steady = [(r["records"] - startup[0]["records"]) / max(r["seconds"] - start_s, 1e-9) for r in runs]
        out.update(startup_s=start_s, median_steady_records_per_s=statistics.median(steady),
                   slowest_steady_records_per_s=min(steady))
    deploys = [r["deploy_s"] for r in runs if "deploy_s" in r]
    if deploys:
        out["median_deploy_s"] = statistics.median(deploys)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="per side (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--lower", type=int, default=-30, help="ms (default -30)")
    parser.add_argument("--upper", type=int, default=30, help="ms (default 30)")
    parser.add_argument("--grain-ms", type=int, default=100,
                        help="event time between two watermarks of a Sluice DataStream source (default 100)")
    parser.add_argument("--parallelism", default="1,2", help="comma-separated (default 1,2)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", default="sluice,sluice-sql,flink-sql",
                        help="of sluice, sluice-sql, flink-sql (default all three)")
    parser.add_argument("--startup-records", type=int, default=1000,
                        help="per side, the start-up run of each engine and parallelism (0: none)")
    parser.add_argument("--coprocess-records", type=int, default=0,
                        help="per side for PyFlink's co-process job (0: not run)")
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "sluice-bench-interval-join"))
    parser.add_argument("--flink-python", default=os.environ.get("SLUICE_FLINK_PYTHON"),
                        help="a Python with PyFlink 2.x (flink-sql and flink-coprocess need it)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--check-flink-count", action="store_true",
                        help="also count Flink SQL's joined rows once (COUNT(*), not timed)")
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    if args.coprocess_records:
        engines.append("flink-coprocess")
    if any(e.startswith("flink") for e in engines) and not args.flink_python:
        parser.error("the Flink engines need --flink-python (a Python with PyFlink 2.x)")
    parallelisms = [int(p) for p in args.parallelism.split(",")]

    data_dir = os.path.abspath(args.data_dir)
    # per parallelism p, p files per side (and as many for the start-up runs): every source subtask reads one
    data = {p: os.path.join(data_dir, f"files-{p}") for p in parallelisms}
    small = {p: os.path.join(data_dir, f"startup-{p}") for p in parallelisms}
    for p in parallelisms:
        manifest = write_inputs(data[p], args.records, args.keys, args.lower, args.upper, p)
        if args.startup_records:
            write_inputs(small[p], args.startup_records, args.keys, args.lower, args.upper, p)
    print(f"interval join, {args.records:,} records per side, {args.keys} keys, bounds [{args.lower}, {args.upper}] ms,"
          f" {manifest['pairs']:,} pairs expected; Sluice grain {args.grain_ms} ms; CPUs {os.cpu_count()}", flush=True)
    if args.check_flink_count and "flink-sql" in engines:
        doc = flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                        ["--left", os.path.join(data[parallelisms[0]], "left"), "--right",
                         os.path.join(data[parallelisms[0]], "right"), "--lower",
                         str(args.lower), "--upper", str(args.upper), "--records", str(args.records), "--count"],
                        args.timeout)
        verdict = "equal" if doc["pairs"] == manifest["pairs"] else "NOT equal"
        print(f"flink-sql counted {doc['pairs']:,} pairs ({verdict} to the expected)", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {}
    startups: dict[str, list[dict[str, Any]]] = {}
    for p in parallelisms:
        for engine in engines:
            if args.startup_records and engine != "flink-coprocess":
                r = one_run(engine, args, p, args.startup_records, small[p])
                startups.setdefault(f"{engine} p={p}", []).append(r)
                print(f"{engine:>15} p={p} start-up run: {r['seconds']:.2f} s (load {r['load']:.2f})", flush=True)
        for i in range(args.repeat):
            for engine in engines:
                records = args.coprocess_records if engine == "flink-coprocess" else args.records
                r = one_run(engine, args, p, records, data[p])
                runs.setdefault(f"{engine} p={p}", []).append(r)
                check = ""
                if "pairs" in r and engine != "flink-coprocess":
                    wrong = "" if r["pairs"] == manifest["pairs"] else " (NOT the expected)"
                    check = f", {r['pairs']:,} pairs{wrong}"
                deploy = f", deploy {r['deploy_s']:.2f} s" if "deploy_s" in r else ""
                print(f"{engine:>15} p={p} run {i + 1}: {r['records'] / r['seconds']:>9,.0f} records/s "
                      f"({r['seconds']:.2f} s{deploy}{check}; load {r['load']:.2f})", flush=True)

    results = {name: summary(rs, startups.get(name, [])) for name, rs in runs.items()}
    print()
    for name, s in results.items():
        steady = (f"; steady {s['median_steady_records_per_s']:,.0f} "
                  f"(slowest {s['slowest_steady_records_per_s']:,.0f}), start-up {s['startup_s']:.2f} s"
                  if "startup_s" in s else "")
        print(f"{name:>21}: median {s['median_records_per_s']:>9,.0f} records/s (slowest "
              f"{s['slowest_records_per_s']:,.0f}){steady}; loads {s['loads']}")
    for p in parallelisms:
        flink = results.get(f"flink-sql p={p}")
        coprocess = results.get(f"flink-coprocess p={p}")
        for engine in ("sluice", "sluice-sql"):
            mine = results.get(f"{engine} p={p}")
            if mine and flink:
                ratio = mine["median_records_per_s"] / flink["median_records_per_s"]
                line = f"{engine} / flink-sql p={p}: {ratio:.2f}x"
                if "median_steady_records_per_s" in mine and "median_steady_records_per_s" in flink:
                    line += f" ({mine['median_steady_records_per_s'] / flink['median_steady_records_per_s']:.2f}x " \
                            "without start-up)"
                print(line)
            if mine and coprocess:
                print(f"{engine} / flink-coprocess p={p}: "
                      f"{mine['median_records_per_s'] / coprocess['median_records_per_s']:.1f}x")
        if flink and coprocess:
            print(f"flink-sql / flink-coprocess p={p}: "
                  f"{flink['median_records_per_s'] / coprocess['median_records_per_s']:.1f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"manifest": manifest, "runs": runs, "startups": startups, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
