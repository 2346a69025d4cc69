#!/usr/bin/env python
"""Throughput benchmark: the runtime against a plain single-process Python baseline.

Runtime: a local cluster of real processes (a coordinator and 2 workers with
2 slots each, on loopback) runs `runtime.examples.wordcount:build_bench`:
generator source (parallelism 2) -> key_by -> keyed Count (parallelism 2) ->
chained DiscardSink. The record count reaches the child processes through
SLUICE_BENCH_RECORDS, set before the cluster starts. A fresh cluster is used
for every repetition (so each worker's peak RSS belongs to one job) and is
always stopped.

Baseline: one plain Python process doing the same per-record work without the
runtime: generate the same records with the source's own `generate_block`,
msgpack-pack each record into ~32 KiB buffers, unpack each buffer with one
streaming Unpacker, count per key in a dict.

Records/s for the runtime = records / job wall time. The wall time is taken
from the task statistics (each task reports busy + idle + backpressured time,
which is its run time from start to finish; the job's is the longest), so it
does not depend on the 0.25 s status polling of `run_job_on_cluster`. The
coordinator's submit -> FINISHED time (which includes deployment) and the
polled time are reported alongside.

    .venv/bin/python scripts/bench_throughput.py --records 4000000 --repeat 3

Each runtime run also says whose CPU it was, in µs per record: the workers' task threads (the records through
the chain), the workers' event loops (network, credit, the hand-off of runs to the task threads; with the loop
threads' context switches), the coordinator and this driver (`cpu_split_us_per_record` in the JSON).

`--isolation-ab` measures what running user code off the event loop costs (issue 31): the runtime only, every
round one run with every task inline on the loop (SLUICE_TASK_ISOLATION=inline), one with every task on its
thread (the default: a run that held the GIL is waited for with the loop blocked) and one on threads with every
run awaited (`awaited`: SLUICE_SYNC_WAIT_S=0, the default until issue 31's last change), the order reversed each
round so a drift of the machine's load hits all alike; it prints the medians and the ratios to inline of CPU
per record and records/s, and the load average at each run.

    .venv/bin/python scripts/bench_throughput.py --isolation-ab --records 2000000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import msgpack  # noqa: E402

from runtime.cli.local_cluster import LocalCluster, run_job_on_cluster  # noqa: E402
from runtime.connectors.generator import BLOCK, generate_block, key_names  # noqa: E402

ENTRY = "runtime.examples.wordcount:build_bench"
# the parameters of GeneratorSource in build_bench
KEYS = 1000
SEED = 7
BUFFER_BYTES = 32 * 1024
TARGET_RATIO = 1.0  # issue 7: two cores must beat one process
TARGET_SPREAD = 1.2  # issue 7: no runtime run slower than this times the median
TARGET_CPU_US = 0.9  # issue 7: CPU per record, all processes


# -- baseline -------------------------------------------------------------------------------


def run_baseline(records: int) -> dict[str, Any]:
    """generate -> pack into ~32 KiB buffers -> unpack -> count per key, in this one process."""
    keys = key_names(KEYS)
    blocks = -(-records // BLOCK)
    counts: dict[Any, int] = {}
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    pack = msgpack.Packer().pack
    buf = bytearray()
    seen = 0
    meter = CpuMeter([])
    t0 = time.perf_counter()
    for b in range(blocks):
        for record in generate_block(b, seed=SEED, keys=keys, cum_weights=None, count=records):
            buf += pack(record)
            if len(buf) >= BUFFER_BYTES:
                unpacker.feed(buf)
                buf = bytearray()
                for rec in unpacker:
                    k = rec[0]
                    counts[k] = counts.get(k, 0) + 1
                    seen += 1
    if buf:
        unpacker.feed(buf)
        for rec in unpacker:
            k = rec[0]
            counts[k] = counts.get(k, 0) + 1
            seen += 1
    elapsed = time.perf_counter() - t0
    cpu = meter.stop()
    if seen != records or sum(counts.values()) != records:
        raise RuntimeError(f"baseline counted {seen} records, expected {records}")
    return {"elapsed_s": elapsed, "records_per_s": records / elapsed, "keys": len(counts),
            "cpu_us_per_record": cpu["cpu_s"] * 1e6 / records if cpu["cpu_s"] is not None else None,
            "other_cores": cpu["other_cores"]}


# -- runtime --------------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process, in seconds (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _thread_figures(pid: int, tid: int) -> tuple[float, int, int] | None:
    """One thread's utime + stime (s) and its voluntary and involuntary context switches (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        switches = {}
        with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
            for line in f:
                if "ctxt_switches" in line:
                    name, value = line.split(":")
                    switches[name] = int(value)
        return ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"])
    except (OSError, ValueError, IndexError, KeyError):
        return None


def _machine_busy_s() -> float | None:
    """CPU seconds spent non-idle by the whole machine since boot, summed over cores (Linux /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """CPU used by some processes and by everything else on the machine over an interval.

    `other_cores` (machine busy time not ours / wall) tells whether something else competed for the CPUs
    during a measurement, which on a shared 2-core machine moves the figures a lot. `split` says whose CPU it
    was: each process's, and of a worker's, its main thread's (the event loop: network, credit, the hand-off
    of runs) apart from its other threads' (the task threads, which run the records; they end with their job, so
    they are the process's CPU less the loop's), with the loop thread's context switches.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids  # this process is always counted as ours
        self.t0 = time.monotonic()
        self.busy0 = _machine_busy_s()
        self.driver0 = time.process_time()
        self.process0 = {pid: _proc_cpu_s(pid) for pid in pids}
        self.loop0 = {pid: _thread_figures(pid, pid) for pid in pids}
        self.cpu0 = self._ours()

    def split(self, names: dict[int, str]) -> dict[str, dict[str, float]]:
        """Since the start, per process named in `names` (and the driver, this process): CPU s of the process
        and of its main thread, and the main thread's voluntary and involuntary context switches."""
        out = {"driver": {"cpu_s": time.process_time() - self.driver0}}
        for pid, name in names.items():
            process0, process1 = self.process0.get(pid), _proc_cpu_s(pid)
            loop0, loop1 = self.loop0.get(pid), _thread_figures(pid, pid)
            if process0 is None or process1 is None or loop0 is None or loop1 is None:
                continue
            out[name] = {"cpu_s": process1 - process0, "loop_cpu_s": loop1[0] - loop0[0],
                         "loop_voluntary_switches": loop1[1] - loop0[1],
                         "loop_involuntary_switches": loop1[2] - loop0[2]}
        return out

    def _ours(self) -> float | None:
        total = time.process_time()
        for pid in self.pids:
            cpu = _proc_cpu_s(pid)
            if cpu is None:
                return None
            total += cpu
        return total

    def stop(self) -> dict[str, float | None]:
        wall = time.monotonic() - self.t0
        busy1, cpu1 = _machine_busy_s(), self._ours()
        if None in (self.busy0, busy1, self.cpu0, cpu1):
            return {"cpu_s": None, "other_cores": None}
        ours = cpu1 - self.cpu0  # type: ignore[operator]
        other = max(0.0, (busy1 - self.busy0) - ours) / wall  # type: ignore[operator]
        return {"cpu_s": ours, "other_cores": other}


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def _run_job(cluster: LocalCluster, records: int, timeout_s: float) -> dict[str, Any]:
    await cluster.wait_workers()
    pids = [w.pid for w in cluster.worker_procs] + ([cluster.coordinator.pid] if cluster.coordinator else [])
    names = {w.pid: w.fields.get("id", f"worker-{i + 1}") for i, w in enumerate(cluster.worker_procs)}
    if cluster.coordinator:
        names[cluster.coordinator.pid] = "coordinator"
    meter = CpuMeter(pids)
    summary = await run_job_on_cluster(cluster, ENTRY, config={}, name="bench-throughput", progress=None,
                                       timeout_s=timeout_s)
    if summary["state"] != "FINISHED":
        raise RuntimeError(f"benchmark job ended {summary['state']}: {summary.get('error', '')}")
    split = meter.split(names)
    cpu = meter.stop()  # from submit to FINISHED as seen by polling
    polled_s = summary["elapsed_s"]
    coordinator_s = summary["ended_at"] - summary["submitted_at"]
    # task statistics reach the coordinator with heartbeats (1 s) and task reports: wait for the final ones
    deadline = time.monotonic() + 10.0
    while True:
        tasks = summary["tasks"]
        if len(tasks) == summary["tasks_total"] and all(t["state"] == "finished" for t in tasks):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("final task statistics did not arrive within 10 s")
        await asyncio.sleep(0.2)
        summary = await cluster.call("status", {"job_id": summary["job_id"]})
    per_task = {t["task"]: {"name": t["name"], "worker": t.get("worker"), "records_in": t["records_in"],
                            "records_out": t["records_out"], "busy_s": t["busy_s"], "idle_s": t["idle_s"],
                            "backpressured_s": t["backpressured_s"],
                            "run_s": t["busy_s"] + t["idle_s"] + t["backpressured_s"]} for t in tasks}
    wall_s = max(t["run_s"] for t in per_task.values())
    # the first vertex is the source (its tasks count what they emit as records_in); every record then enters
    # a keyed count task exactly once
    source_name = summary["vertices"][0]["name"]
    is_source = {k: t["name"].rsplit(" (", 1)[0] == source_name for k, t in per_task.items()}
    emitted = sum(t["records_in"] for k, t in per_task.items() if is_source[k])
    consumed = sum(t["records_in"] for k, t in per_task.items() if not is_source[k])
    if consumed != records or emitted != records:
        raise RuntimeError(f"runtime: sources emitted {emitted}, keyed tasks consumed {consumed}, expected {records}")
    return {"elapsed_s": wall_s, "records_per_s": records / wall_s, "polled_s": polled_s,
            "submit_to_finished_s": coordinator_s,
            "cpu_us_per_record": cpu["cpu_s"] * 1e6 / records if cpu["cpu_s"] is not None else None,
            "other_cores": cpu["other_cores"], "cpu_split": split,
            "cpu_split_us_per_record": split_per_record(split, records), "tasks": per_task}


def split_per_record(split: dict[str, dict[str, float]], records: int) -> dict[str, float]:
    """CpuMeter.split in µs per record, by role: the coordinator, the driver, the workers' loop threads and
    their other threads (the task threads), summed over the workers; switches per 1,000 records."""
    out = {"coordinator": 0.0, "driver": 0.0, "worker_loops": 0.0, "worker_task_threads": 0.0,
           "loop_voluntary_switches_per_krecord": 0.0, "loop_involuntary_switches_per_krecord": 0.0}
    for name, figures in split.items():
        if name in ("coordinator", "driver"):
            out[name] += figures["cpu_s"] * 1e6 / records
            continue
        out["worker_loops"] += figures["loop_cpu_s"] * 1e6 / records
        out["worker_task_threads"] += (figures["cpu_s"] - figures["loop_cpu_s"]) * 1e6 / records
        out["loop_voluntary_switches_per_krecord"] += figures["loop_voluntary_switches"] * 1e3 / records
        out["loop_involuntary_switches_per_krecord"] += figures["loop_involuntary_switches"] * 1e3 / records
    return out


@contextlib.contextmanager
def logs_kept_on_failure(cluster: LocalCluster, log_dir: str) -> Iterator[LocalCluster]:
    """Stop `cluster` (by PID) however the block ends; remove its `log_dir` if the block succeeded, else keep it
    and say where in the exception."""
    try:
        yield cluster
    except BaseException as exc:
        exc.add_note(f"cluster logs kept in {log_dir}")
        raise
    finally:
        cluster.stop()
    shutil.rmtree(log_dir, ignore_errors=True)


def run_runtime(records: int, timeout_s: float) -> dict[str, Any]:
    os.environ["SLUICE_BENCH_RECORDS"] = str(records)  # inherited by the cluster's processes
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-")
    with logs_kept_on_failure(LocalCluster(workers=2, slots=2, log_dir=log_dir), log_dir) as cluster:
        cluster.start()
        result = asyncio.run(_run_job(cluster, records, timeout_s))
        hwm = {w.fields.get("id", str(w.pid)): _vm_hwm_kib(w.pid) for w in cluster.worker_procs}
        result["worker_peak_rss_kib"] = hwm
        result["coordinator_peak_rss_kib"] = _vm_hwm_kib(cluster.coordinator.pid) if cluster.coordinator else None
    return result


def _fmt(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _median_known(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# -- driver ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "msgpack": msgpack.version, "event_loop": loop, "platform": platform.platform(), "revision": revision()}


def revision() -> str:
    """The commit measured, with -dirty when runtime/, netstack/ or coordinator/ had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "runtime", "netstack", "coordinator"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


# user code on the event loop / on each task's thread (the default) / on threads, every run awaited
ISOLATION_MODES = ("inline", "thread", "awaited")
SYNC_WAIT_ENV = "SLUICE_SYNC_WAIT_S"  # runtime/execution/isolation.py


def isolation_ab(records: int, repeat: int, timeout_s: float, say: Any) -> dict[str, Any]:
    """Inline against thread, alternating, in one invocation (see the module docstring)."""
    from runtime.execution.isolation import MODE_ENV

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in ISOLATION_MODES}
    previous = os.environ.get(MODE_ENV), os.environ.get(SYNC_WAIT_ENV)
    try:
        for i in range(repeat):
            for mode in ISOLATION_MODES if i % 2 == 0 else reversed(ISOLATION_MODES):
                # inherited by the cluster's workers
                os.environ[MODE_ENV] = "inline" if mode == "inline" else "thread"
                if mode == "awaited":
                    os.environ[SYNC_WAIT_ENV] = "0"
                else:
                    os.environ.pop(SYNC_WAIT_ENV, None)
                load_before = os.getloadavg()[0]
                r = run_runtime(records, timeout_s)
                r["mode"], r["load_average_1m"] = mode, (load_before, os.getloadavg()[0])
                runs[mode].append(r)
                say(f"  round {i + 1}: {mode:<7} {r['records_per_s']:>12,.0f} rec/s  "
                    f"{_fmt(r['cpu_us_per_record'], '.2f')} CPU us/rec; other load {_fmt(r['other_cores'], '.2f')} "
                    f"cores; load average {load_before:.2f} -> {r['load_average_1m'][1]:.2f}")
    finally:
        for name, value in zip((MODE_ENV, SYNC_WAIT_ENV), previous, strict=True):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    medians = {mode: {"records_per_s": statistics.median(r["records_per_s"] for r in rs),
                      "records_per_s_slowest": min(r["records_per_s"] for r in rs),
                      "cpu_us_per_record": _median_known(r["cpu_us_per_record"] for r in rs),
                      "cpu_us_per_record_slowest": max((r["cpu_us_per_record"] for r in rs
                                                        if r["cpu_us_per_record"] is not None), default=None)}
               for mode, rs in runs.items()}
    inline = medians["inline"]

    def over_inline(mode: str) -> dict[str, float | None]:
        mine = medians[mode]
        # per round too: the runs of a round saw the most similar machine
        paired = [t["cpu_us_per_record"] / n["cpu_us_per_record"] for n, t in zip(runs["inline"], runs[mode],
                                                                                   strict=True)
                  if t["cpu_us_per_record"] and n["cpu_us_per_record"]]
        return {"cpu_per_record": (mine["cpu_us_per_record"] / inline["cpu_us_per_record"]
                                   if mine["cpu_us_per_record"] and inline["cpu_us_per_record"] else None),
                "cpu_per_record_paired_median": statistics.median(paired) if paired else None,
                "records_per_s": mine["records_per_s"] / inline["records_per_s"]}

    loads = [x for rs in runs.values() for r in rs for x in r["load_average_1m"]]
    return {"benchmark": "isolation_ab", "entry": ENTRY, "records": records, "repeat": repeat, "medians": medians,
            "over_inline": {mode: over_inline(mode) for mode in ISOLATION_MODES if mode != "inline"},
            "load_average_1m_range": (min(loads), max(loads)), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4_000_000, help="records per run (default 4,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement, alternating (default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a runtime job after this many s")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--isolation-ab", action="store_true",
                        help="the runtime only: tasks inline on the loop against tasks on their threads, alternating")
    args = parser.parse_args(argv)
    if args.records < 1 or args.repeat < 1:
        parser.error("--records and --repeat must be >= 1")

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    info = machine()
    say(f"bench_throughput: {args.records:,} records x {args.repeat} runs; {info['nproc']} cpus "
        f"({info['cpu_model']}), Python {info['python']}, msgpack {'.'.join(map(str, info['msgpack']))}, "
        f"{info['event_loop']}; revision {info['revision']}")
    if args.isolation_ab:
        ab = {**isolation_ab(args.records, args.repeat, args.timeout, say), "machine": info}
        if args.json:
            print(json.dumps(ab, indent=2))
            return 0
        for mode, m in ab["medians"].items():
            print(f"{mode:<7}: median {m['records_per_s']:>12,.0f} records/s "
                  f"(slowest {m['records_per_s_slowest']:,.0f}), {_fmt(m['cpu_us_per_record'], '.3f')} CPU us/record "
                  f"(slowest {_fmt(m['cpu_us_per_record_slowest'], '.3f')})")
        for mode, r in ab["over_inline"].items():
            print(f"{mode} / inline: CPU per record {_fmt(r['cpu_per_record'], '.3f')} (medians), "
                  f"{_fmt(r['cpu_per_record_paired_median'], '.3f')} (median of the rounds' ratios); "
                  f"records/s {r['records_per_s']:.3f}")
        low, high = ab["load_average_1m_range"]
        print(f"load average (1 min) during the runs: {low:.2f} - {high:.2f}")
        return 0
    runtime_runs: list[dict[str, Any]] = []
    baseline_runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        r = run_runtime(args.records, args.timeout)
        runtime_runs.append(r)
        rss = ", ".join(f"{w} {kib / 1024:.0f} MiB" for w, kib in r["worker_peak_rss_kib"].items() if kib)
        say(f"  run {i + 1}: runtime  {r['records_per_s']:>12,.0f} rec/s  ({r['elapsed_s']:.2f} s; "
            f"submit->FINISHED {r['submit_to_finished_s']:.2f} s; {_fmt(r['cpu_us_per_record'], '.2f')} CPU us/rec; "
            f"other load {_fmt(r['other_cores'], '.2f')} cores; worker peak RSS {rss})")
        sp = r["cpu_split_us_per_record"]
        say(f"         CPU us/rec by thread: workers' task threads {sp['worker_task_threads']:.3f}, workers' loops "
            f"{sp['worker_loops']:.3f} ({sp['loop_voluntary_switches_per_krecord']:.2f} + "
            f"{sp['loop_involuntary_switches_per_krecord']:.2f} switches per 1,000 records), coordinator "
            f"{sp['coordinator']:.3f}, driver {sp['driver']:.3f}")
        b = run_baseline(args.records)
        baseline_runs.append(b)
        say(f"  run {i + 1}: baseline {b['records_per_s']:>12,.0f} rec/s  ({b['elapsed_s']:.2f} s; "
            f"{_fmt(b['cpu_us_per_record'], '.2f')} CPU us/rec; other load {_fmt(b['other_cores'], '.2f')} cores)")

    rt = statistics.median(r["records_per_s"] for r in runtime_runs)
    bl = statistics.median(b["records_per_s"] for b in baseline_runs)
    ratio = rt / bl
    rt_elapsed = [r["elapsed_s"] for r in runtime_runs]
    spread = max(rt_elapsed) / statistics.median(rt_elapsed)  # slowest run over the median
    rt_cpu = _median_known(r["cpu_us_per_record"] for r in runtime_runs)
    bl_cpu = _median_known(b["cpu_us_per_record"] for b in baseline_runs)
    other = max((x["other_cores"] for x in runtime_runs + baseline_runs if x["other_cores"] is not None), default=None)
    peak_rss = max((kib for r in runtime_runs for kib in r["worker_peak_rss_kib"].values() if kib), default=None)
    result = {
        "benchmark": "throughput", "entry": ENTRY, "records": args.records, "repeat": args.repeat,
        "machine": info,
        "runtime_records_per_s_median": rt, "baseline_records_per_s_median": bl, "ratio": ratio,
        "target_ratio": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO,
        "runtime_slowest_over_median": spread, "target_spread": TARGET_SPREAD, "target_cpu_us": TARGET_CPU_US,
        "runtime_cpu_us_per_record_median": rt_cpu, "baseline_cpu_us_per_record_median": bl_cpu,
        "other_load_cores_max": other,
        "worker_peak_rss_kib_max": peak_rss,
        "runtime_runs": runtime_runs, "baseline_runs": baseline_runs,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"median runtime : {rt:>12,.0f} records/s  (2 workers x 2 slots, keyed count, discard sink)")
        print(f"median baseline: {bl:>12,.0f} records/s  (one process: generate, pack, unpack, dict count)")
        print(f"ratio runtime/baseline: {ratio:.2f}  (target >= {TARGET_RATIO}: "
              f"{'met' if ratio >= TARGET_RATIO else 'NOT met'})")
        print(f"slowest runtime run / median: {spread:.2f}  (target <= {TARGET_SPREAD})")
        if rt_cpu is not None and bl_cpu is not None:
            print(f"CPU per record: runtime {rt_cpu:.2f} us (all processes; target <= {TARGET_CPU_US}), "
                  f"baseline {bl_cpu:.2f} us")
        if other is not None and other > 0.1:
            print(f"note: other processes used up to {other:.2f} cores during a measurement; the machine was not idle")
        if peak_rss:
            print(f"worker peak RSS (VmHWM, max over workers and runs): {peak_rss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
