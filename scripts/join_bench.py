"""What the join benchmarks against Flink share (scripts/bench_interval_join.py, scripts/bench_window_join.py):
the input files, one run of a Sluice job on a fresh local cluster, one run of a Flink job script, and the session
(start-up runs, engines alternating, the expected pair count checked on every run, medians and ratios).

Input (written once into a directory, reused while its manifest matches): per side `records` JSON objects
`{"k": key, "seq": seq, "ts": event time ms}`, seq 0..N-1, the event time T0 + seq, the key a fixed hash of seq
over `keys` keys, other hashes on the two sides (the records of scripts/bench_joins.py); for a run at parallelism
p, in p JSON-lines files per side (seq s in file s mod p, each file in event-time order), named so that Sluice's
source subtask j reads file j and Flink's readers take one file each: every source subtask reads, and the readers
advance together in event time (watermarks with no delay lose nothing).

Times: Sluice from the submit call to FINISHED (status polled every 50 ms), with deployment (submit to every task
running) reported apart; Flink its job's net run time (submission to end inside the mini cluster: scheduling and
deployment in it; the JVM's start and the SQL planning not). Start-up: the same job over --startup-records per
side, its median time; "steady" rates = (records - startup records) / (time - start-up time). Records/s count both
sides. Median and slowest of --repeat runs, the engines alternating; the 1-minute load average (os.getloadavg)
is recorded before every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
T0 = 1_700_000_000_000
LEFT_HASH, RIGHT_HASH = (2654435761, 0), (40503, 17)  # bench_joins' SeqSource and flink_interval_join_job's
DEFAULT_DATA_DIR = os.path.join(tempfile.gettempdir(), "sluice-bench-interval-join")  # both benchmarks' files


# -- input -------------------------------------------------------------------------------------------------


def key_of(seq: int, keys: int, hashing: tuple[int, int]) -> str:
    return f"k{(seq * hashing[0] + hashing[1]) % keys:03d}"


def side_records(records: int, keys: int, hashing: tuple[int, int]) -> Iterator[tuple[str, int]]:
    """(key, event time) of a side's records, in event-time order."""
    for seq in range(records):
        yield key_of(seq, keys, hashing), T0 + seq


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


def write_inputs(directory: str, records: int, keys: int, files: int) -> None:
    """The two sides' files under `directory` (left/, right/; `files` per side, seq s in file s mod `files`, so
    parallel readers advance together in event time), unless its manifest says they are there already."""
    manifest_path = os.path.join(directory, "manifest.json")
    wanted = {"records": records, "keys": keys, "files": files}
    if os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            manifest: dict[str, Any] = json.load(f)
        if {k: manifest.get(k) for k in wanted} == wanted:
            return
    for side, hashing in (("left", LEFT_HASH), ("right", RIGHT_HASH)):
        shutil.rmtree(os.path.join(directory, side), ignore_errors=True)
        os.makedirs(os.path.join(directory, side))
        for j, name in enumerate(part_names(files)):
            with open(os.path.join(directory, side, name), "w", encoding="utf-8") as f:
                f.writelines(f'{{"k":"{key_of(seq, keys, hashing)}","seq":{seq},"ts":{T0 + seq}}}\n'
                             for seq in range(j, records, files))
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(wanted, f)


# -- what the Sluice jobs share (built in the cluster's processes) --------------------------------------------


def job_settings(env_var: str) -> dict[str, Any]:
    """The job's settings, which the benchmark put in the environment before the cluster started."""
    return dict(json.loads(os.environ.get(env_var, "{}")))


def _row(record: dict[str, Any]) -> tuple[str, int, int]:
    return record["k"], record["seq"], record["ts"]


def file_sides(job: Any, s: dict[str, Any], *, side_groups: bool = False) -> list[Any]:
    """The two sides as streams of (k, seq, ts): a bounded json FileSource per side at the job's parallelism with
    watermarks of no delay every `grain_ms`, each mapped to a tuple; `side_groups`: each source (and its map) in a
    slot sharing group of its own, named after its side."""
    from runtime.api import BoundedOutOfOrderness, FileSource

    p = s["parallelism"]
    timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=itemgetter("ts"), granularity_ms=s["grain_ms"])
    sides = []
    for side in ("left", "right"):
        source = job.source(FileSource(s[side], format="json", bounded=True), name=side, parallelism=p,
                            watermarks=timed)
        if side_groups:
            source.slot_sharing_group(side)  # its map follows it
        sides.append(source.map(_row, name=f"{side}-rows", parallelism=p))
    return sides


def sql_tables(s: dict[str, Any]) -> str:
    """Sluice SQL: a filesystem json table per side (l, r) over the files, the rowtime `ts` with no delay."""
    return "\n".join(f"""
        CREATE TABLE {name} (k STRING, seq BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)
        WITH ('connector' = 'filesystem', 'path' = '{s[side]}', 'format' = 'json');"""
                     for name, side in (("l", "left"), ("r", "right")))


# -- runs ------------------------------------------------------------------------------------------------------


def sluice_run(engine: str, entry: str, env_var: str, job_settings: dict[str, Any], records: int,
               timeout_s: float) -> dict[str, Any]:
    """One run of the job `entry` (module:function under scripts/, reading its settings from the environment
    variable `env_var`) on a fresh local cluster of 2 workers with 2 slots: seconds from submit to FINISHED,
    deployment (submit to every task running) apart, the pairs its sink took in."""
    from runtime.cli.local_cluster import LocalCluster

    os.environ[env_var] = json.dumps(job_settings)  # set before the cluster starts: its processes inherit it
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-join-")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir)

    async def measure() -> dict[str, Any]:
        await cluster.wait_workers()
        load = os.getloadavg()[0]
        submitted = time.monotonic()
        job_id = (await cluster.call("submit", {"entry": entry, "name": f"bench-{engine}", "config": {},
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
    """One run of a Flink job script under scripts/ with PyFlink's Python: its last JSON line, the load before."""
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


# -- a session -------------------------------------------------------------------------------------------------


def add_session_arguments(parser: argparse.ArgumentParser, engines: str) -> None:
    """The options every join benchmark takes (records, keys, parallelisms, repeats, engines, Flink's Python)."""
    parser.add_argument("--records", type=int, default=1_000_000, help="per side (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--parallelism", default="1,2", help="comma-separated (default 1,2)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", default=engines, help=f"comma-separated (default {engines})")
    parser.add_argument("--startup-records", type=int, default=1000,
                        help="per side, the start-up run of each engine and parallelism (0: none)")
    parser.add_argument("--coprocess-records", type=int, default=0,
                        help="per side for PyFlink's co-process job (0: not run)")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--flink-python", default=os.environ.get("SLUICE_FLINK_PYTHON"),
                        help="a Python with PyFlink 2.x (flink-sql and flink-coprocess need it)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--check-flink-count", action="store_true",
                        help="also count Flink SQL's joined rows once (COUNT(*), not timed)")
    parser.add_argument("--json", help="also write every run's figures to this file")


def session(args: argparse.Namespace, parser: argparse.ArgumentParser, title: str, pairs: int,
            one_run: Callable[[str, int, int, str], dict[str, Any]],
            flink_count: Callable[[str], dict[str, Any]]) -> int:
    """Write the inputs, then per parallelism: each engine's start-up run, then `--repeat` rounds of every engine
    in turn (`one_run(engine, p, records, directory)`), every pair count checked against `pairs`; print medians
    and ratios. `flink_count(directory)` counts Flink SQL's pairs (--check-flink-count)."""
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
        write_inputs(data[p], args.records, args.keys, p)
        if args.startup_records:
            write_inputs(small[p], args.startup_records, args.keys, p)
    print(f"{title}, {args.records:,} records per side, {args.keys} keys, {pairs:,} pairs expected; "
          f"CPUs {os.cpu_count()}", flush=True)
    if args.check_flink_count and "flink-sql" in engines:
        counted = flink_count(data[parallelisms[0]])["pairs"]
        print(f"flink-sql counted {counted:,} pairs ({'equal' if counted == pairs else 'NOT equal'} to the "
              "expected)", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {}
    startups: dict[str, list[dict[str, Any]]] = {}
    for p in parallelisms:
        for engine in engines:
            if args.startup_records and engine != "flink-coprocess":
                r = one_run(engine, p, args.startup_records, small[p])
                startups.setdefault(f"{engine} p={p}", []).append(r)
                print(f"{engine:>15} p={p} start-up run: {r['seconds']:.2f} s (load {r['load']:.2f})", flush=True)
        for i in range(args.repeat):
            for engine in engines:
                records = args.coprocess_records if engine == "flink-coprocess" else args.records
                r = one_run(engine, p, records, data[p])
                runs.setdefault(f"{engine} p={p}", []).append(r)
                check = ""
                if "pairs" in r and engine != "flink-coprocess":
                    wrong = "" if r["pairs"] == pairs else " (NOT the expected)"
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
        for engine in (e for e in engines if e.startswith("sluice")):
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
            json.dump({"pairs": pairs, "runs": runs, "startups": startups, "results": results}, f, indent=1)
    return 0


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
