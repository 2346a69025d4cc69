"""Nexmark on Sluice SQL and on Flink SQL, row for row, with each one's run time.

    .venv/bin/python scripts/nexmark_compare.py --events 200000 --flink-python FLINK_VENV/bin/python
        [--queries q0,q1,...] [--data .nexmark] [--workers 2] [--parallelism 1] [--repeat 1]

--queries names Nexmark queries (scripts/nexmark/queries.py, QUERIES: the default, all of them) or the checks of
other SQL constructs over the same tables (CHECKS there: OVER, window Top-N, DISTINCT, UNION, window joins).

Generates the tables with `sluice data nexmark` (Spark) into --data unless they are there for that many events,
then per query: Sluice runs the script (scripts/nexmark/tables.sql + a filesystem sink, upsert by the query's
key when it updates) with `sluice sql` on a local cluster; Flink runs the same SELECT (scripts/flink_nexmark_job.py)
and applies its changelog. Both results are compared as multisets of rows (timestamps in Flink SQL's text form,
decimals as numbers). Prints a table: rows, equal or not, Sluice's job time (submit to FINISHED, from `sluice sql`'s
last line) and Flink's (submit to the end of the results), their ratio; with --throughput instead the events per
second of each (the generated events over the job's time, Nexmark's convention: every query is charged the whole
event stream), median and slowest of --repeat runs (alternating Sluice, Flink), and the load average over them.
--json FILE appends one JSON line per run; --blackhole sends both engines' rows to a 'blackhole' table (no
comparison: what is timed is the query, not Flink's collect() nor Sluice's file commits). Exit status 1 when a
query differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from nexmark.queries import CHECKS, QUERIES  # noqa: E402

EVERY_QUERY = {**QUERIES, **CHECKS}  # --queries takes either's names; the default is the Nexmark queries


def generate(data: Path, events: int) -> None:
    marker = data / "EVENTS"
    if marker.exists() and marker.read_text().strip() == str(events):
        return
    subprocess.run([sys.executable, "-m", "runtime.cli", "data", "nexmark", str(data), "--events", str(events)],
                   check=True, cwd=ROOT)
    marker.write_text(str(events))


def tables(data: Path) -> str:
    return (ROOT / "scripts" / "nexmark" / "tables.sql").read_text().replace("{dir}", str(data.resolve()))


def sluice_script(data: Path, name: str, out: Path, parallelism: int, *, blackhole: bool = False) -> str:
    columns, key, select = EVERY_QUERY[name]
    pk = f", PRIMARY KEY ({key}) NOT ENFORCED" if key else ""
    sink = "'connector' = 'blackhole'" if blackhole else \
        f"'connector' = 'filesystem', 'path' = '{out}', 'format' = 'json'"
    return (f"SET 'parallelism.default' = '{parallelism}';\n" + tables(data)
            + f"CREATE TABLE nexmark_out ({columns}{pk}) WITH ({sink});\n"
            + f"INSERT INTO nexmark_out {select};\n")


def run_sluice(data: Path, name: str, workers: int, parallelism: int, *, blackhole: bool = False
               ) -> tuple[Counter[str], float]:
    work = Path(tempfile.mkdtemp(prefix=f"nexmark-{name}-"))
    try:
        out = work / "out"
        script = work / f"{name}.sql"
        script.write_text(sluice_script(data, name, out, parallelism, blackhole=blackhole))
        proc = subprocess.run([sys.executable, "-m", "runtime.cli", "sql", str(script), "--workers", str(workers)],
                              cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"sluice sql {name} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        match = re.search(r"job FINISHED in ([0-9.]+)s", proc.stdout)
        seconds = float(match.group(1)) if match else float("nan")
        return final_rows(out, EVERY_QUERY[name][1]), seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def final_rows(out: Path, key: str | None) -> Counter[str]:
    """The committed rows; an upsert table's as the last change per primary key (a subtask's files in commit
    order; a key always goes to the same subtask)."""
    def order(p: Path) -> tuple[int, ...]:
        _, subtask, checkpoint, attempt, n = p.name.split(".")[0].split("-")
        return int(subtask), int(checkpoint), int(attempt), int(n)
    parts = sorted((p for p in out.iterdir() if p.name.startswith("part-")), key=order) if out.exists() else []
    rows: Counter[str] = Counter()
    if key is None:
        for p in parts:
            for line in p.read_text().splitlines():
                rows[json.dumps(list(json.loads(line).values()))] += 1
        return rows
    names = [k.strip().strip("`") for k in key.split(",")]
    by_key: dict[str, str | None] = {}
    for p in parts:
        for line in p.read_text().splitlines():
            change = json.loads(line)
            data = change["data"]
            k = json.dumps([data[n] for n in names])
            by_key[k] = None if change["op"] == "-D" else json.dumps(list(data.values()))
    return Counter(v for v in by_key.values() if v is not None)


def run_flink(python: str, data: Path, name: str, parallelism: int, *, blackhole: bool = False
              ) -> tuple[Counter[str], float]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(tables(data))
        path = f.name
    try:
        columns, key, select = EVERY_QUERY[name]
        proc = subprocess.run([python, str(ROOT / "scripts" / "flink_nexmark_job.py"), "--tables", path, "--query",
                               select, "--parallelism", str(parallelism), "--key", key or "",
                               *(["--blackhole", columns] if blackhole else [])],
                              capture_output=True, text=True, timeout=3600)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise RuntimeError(f"Flink {name} failed: {proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    summary = json.loads(lines[-1])
    return Counter(lines[:-1]), float(summary["flink_seconds"])


def record(path: str | None, query: str, engine: str, run: int, seconds: float, events: int) -> None:
    """One run as a JSON line (query, engine, run, seconds, events/s, the 1-minute load average after it)."""
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"query": query, "engine": engine, "run": run, "seconds": seconds,
                                "events_per_s": events / seconds, "load": os.getloadavg()[0]}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--data", default=".nexmark")
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--flink-python", default=os.environ.get("SLUICE_FLINK_PYTHON"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--throughput", action="store_true", help="print events/s (median, slowest) and the load")
    parser.add_argument("--blackhole", action="store_true",
                        help="both engines write to a 'blackhole' table (no result compared: a throughput run that "
                             "does not time Flink's collect() or Sluice's file commits)")
    parser.add_argument("--json", help="append one JSON line per run to this file")
    args = parser.parse_args()
    data = Path(args.data)
    generate(data, args.events)
    names = [q.strip() for q in args.queries.split(",") if q.strip()]
    if args.throughput:
        print(f"{'query':<6} {'rows':>9} {'equal':<6} {'sluice ev/s':>11} {'slowest':>8} {'flink ev/s':>10} "
              f"{'slowest':>8} {'sluice/flink':>12} {'load':>10}")
    else:
        print(f"{'query':<6} {'rows':>9} {'equal':<6} {'sluice s':>9} {'slowest':>8} {'flink s':>8} {'slowest':>8} "
              f"{'sluice/flink':>12}")
    failed = False
    for name in names:
        sluice_times, flink_times = [], []
        ours: Counter[str] = Counter()
        theirs: Counter[str] | None = None
        loads = [os.getloadavg()[0]]
        for run in range(args.repeat):
            ours, s = run_sluice(data, name, args.workers, args.parallelism, blackhole=args.blackhole)
            sluice_times.append(s)
            record(args.json, name, "sluice", run, s, args.events)
            if args.flink_python:
                theirs, f = run_flink(args.flink_python, data, name, args.parallelism, blackhole=args.blackhole)
                flink_times.append(f)
                record(args.json, name, "flink", run, f, args.events)
            loads.append(os.getloadavg()[0])
        equal: Any = "-"
        if theirs is not None and not args.blackhole:
            equal = ours == theirs
            if not equal:
                failed = True
                missing, extra = theirs - ours, ours - theirs
                print(f"  {name}: {sum(missing.values())} rows only Flink has, e.g. {list(missing)[:2]}; "
                      f"{sum(extra.values())} only Sluice has, e.g. {list(extra)[:2]}")
        fm = median(flink_times) if flink_times else float("nan")
        sm = median(sluice_times)
        if args.throughput:
            slowest_flink = args.events / max(flink_times) if flink_times else float("nan")
            print(f"{name:<6} {sum(ours.values()):>9,} {str(equal):<6} {args.events / sm:>11,.0f} "
                  f"{args.events / max(sluice_times):>8,.0f} {args.events / fm:>10,.0f} {slowest_flink:>8,.0f} "
                  f"{fm / sm:>12.2f} {min(loads):>4.0f}-{max(loads):<4.0f}", flush=True)
            continue
        print(f"{name:<6} {sum(ours.values()):>9,} {str(equal):<6} {sm:>9.2f} {max(sluice_times):>8.2f} "
              f"{fm:>8.2f} {max(flink_times) if flink_times else float('nan'):>8.2f} {sm / fm:>12.2f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
