#!/usr/bin/env python
"""Rescale benchmark: how long `sluice rescale` of a running, fully backpressured job takes, and how long the job
produces nothing, versus state size, in-flight data and the checkpoint mode (aligned vs unaligned).

Cluster: a local cluster of real processes (runtime.cli.local_cluster.LocalCluster): a coordinator and 2 workers
with 2 slots each, on loopback; one cluster per configuration, several rescales on it.

Job (written into a temp dir as `rescale_job.py`, the cluster runs from that dir so every process imports it):

    GeneratorSource(count=None, keys=K, seed=7) p=2 -> key_by -> PaddedCount p=2 -> MarkSink (chained)

PaddedCount is scripts/bench_recovery.py's keyed count: at the start of the job every key its subtask owns gets a
value [count, --pad bytes], so K sets the state size from the first checkpoint on. The sink is slow (--sink-delay-us
per record), so the count task is the bottleneck and every channel in front of it is full: the buffers per channel
(job config `buffers_per_channel`, with the adaptive in-flight bound off) set how much data is in flight, which an
unaligned checkpoint persists and an aligned one waits for. MarkSink appends `time.time() attempt subtask kind` to a
side file when it opens (`open`) and at its first record of an attempt (`first`); it keeps no state.

Checkpoints are taken only on request (no interval), so a rescale's checkpoint never queues behind a periodic one:
the figures are the rescale's own. After a warm-up (RUNNING, every task backpressured for --warmup s), the job is
rescaled 2 -> 3 -> 2 -> 3 ... (--repeat rescales) through the coordinator's `rescale` RPC (what `sluice rescale`
sends; the CLI's own start-up is not counted), waiting --between s of backpressure between rescales. Per rescale:

- checkpoint: request -> the rescale's checkpoint completed (the job runs on meanwhile: no downtime);
- downtime: the coordinator's figure, which `sluice rescale` prints: the old attempt is stopped -> every task of
  the new attempt deployed and started (includes reading the checkpoint's state and channel state on deploy);
- request -> running: the rescale RPC answered (checkpoint + downtime + the RPC's round trip);
- request -> first output: the first `first` line of the new attempt (a record reached a sink of the job at the
  new parallelism, i.e. emitted; committed would add the sink's next checkpoint) minus the request time;
- stop -> first output: the same from the stop (the answer's time minus the downtime): the time with no output.

With --upgrade, each step is `sluice upgrade` to the same module at the next parallelism instead (the
coordinator's `upgrade` RPC): an aligned savepoint while the job runs (its "checkpoint" figure), then the job is
cancelled and a new job submitted from the savepoint; downtime is the coordinator's figure (cancel -> the new job
RUNNING), first output the new job's first `first` line after the cancel.

With --cli, every configuration starts with one more rescale that runs the real `sluice rescale` command and
checks that it prints one line with the downtime, and that a refused rescale (too many slots) prints one line on
stderr; its times include the commands' start-up, so it is left out of the medians.

    .venv/bin/python scripts/bench_rescale.py --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
for path in (ROOT, SCRIPTS):
    if path not in sys.path:
        sys.path.insert(0, path)

from bench_recovery import JOB_MODULE, _bytes, _median, _s, machine_load  # noqa: E402
from bench_throughput import machine  # noqa: E402

from runtime.cli.client import call_coordinator  # noqa: E402
from runtime.cli.local_cluster import LocalCluster  # noqa: E402

MODULE = "rescale_job"
ENTRY = f"{MODULE}:build"
WORKERS = 2
SLOTS = 2
SHAPES = (3, 2)  # the job starts at 2; rescales alternate to 3 and back to 2
TARGET_DOWNTIME_S = 1.0  # from the issue: at most 1 s plus the restore's own I/O, 2-worker job
TARGET_RATIO = 5.0  # unaligned rescale under backpressure at least 5x faster than aligned

# bench_recovery's job with a stateless sink that marks when it opens and its first record
_SINK = '''

class MarkSink(Sink):
    """A slow sink that appends `time attempt subtask kind` when it opens and at its first record of an attempt."""

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self.first = True
        self.fd = os.open(PROGRESS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._line("open")

    def _line(self, kind):
        os.write(self.fd, f"{time.time():.6f} {self.attempt} {self.subtask_index} {kind}\\n".encode())

    def write(self, record):
        if self.first:
            self.first = False
            self._line("first")
        self.throttle()

    def close(self):
        os.close(self.fd)


def build(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=KEYS, seed=7), parallelism=2)
        .key_by(lambda r: r[0])
        .process(PaddedCount(), parallelism=2)
        .sink(MarkSink(delay_per_record_s=DELAY_S)))
'''
JOB = JOB_MODULE[: JOB_MODULE.index("\nclass ProgressSink")] + _SINK
JOB = JOB.replace("bench_recovery.py: the job whose recovery", "bench_rescale.py: the job whose rescale")


INFLIGHT_TARGET_S = 0.0  # --inflight-target: off, so that the buffers per channel set the in-flight data


def job_config(mode: str, buffers: int, checkpoint_timeout_s: float) -> dict[str, Any]:
    return {"buffers_per_channel": buffers, "inflight_target_s": INFLIGHT_TARGET_S,
            "checkpoint": {"interval_s": None, "mode": mode, "timeout_s": checkpoint_timeout_s,
                           "tolerable_failures": 100, "min_pause_s": 0},
            "restart": {"kind": "fixed", "max_attempts": 5, "delay_s": 0.0}}


def first_output(progress: str, attempt: int) -> tuple[float | None, float | None]:
    """(time.time() of the first `open`, of the first `first` line) of `attempt`, or None."""
    opened: list[float] = []
    firsts: list[float] = []
    try:
        with open(progress, encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4 and parts[1] == str(attempt):
                    (opened if parts[3] == "open" else firsts).append(float(parts[0]))
    except FileNotFoundError:
        pass
    return (min(opened) if opened else None), (min(firsts) if firsts else None)


def first_after(progress: str, t: float) -> float | None:
    """time.time() of the first `first` line after `t` (of whichever job), or None."""
    with open(progress, encoding="ascii") as f:
        firsts = [float(line.split()[0]) for line in f if line.endswith(" first\n") and float(line.split()[0]) > t]
    return min(firsts) if firsts else None


# -- one configuration -------------------------------------------------------------------------------------


async def _status(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return await cluster.call("status", {"job_id": job_id})


async def _wait_backpressured(cluster: LocalCluster, job_id: str, parallelism: int, seconds: float,
                              timeout_s: float) -> dict[str, Any]:
    """Until the job runs at `parallelism` and its sources (the tasks in front of the slow count + sink, which is
    never backpressured itself) have been backpressured for `seconds` in this attempt."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = await _status(cluster, job_id)
        if st["state"] in ("FAILED", "CANCELLED", "FINISHED"):
            raise RuntimeError(f"job {st['state']}: {st.get('error')}")
        if (st["state"] == "RUNNING" and all(v["parallelism"] == parallelism for v in st["vertices"])
                and len(st["tasks"]) == 2 * parallelism
                and sum((t.get("backpressured_s") or 0) >= seconds for t in st["tasks"]) >= parallelism):
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"job not backpressured at parallelism {parallelism} for {seconds}s within "
                               f"{timeout_s}s: {st['state']} {[t.get('backpressured_s') for t in st['tasks']]}")
        await asyncio.sleep(0.1)


def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    host, port = cluster.rpc
    return subprocess.run([sys.executable, "-m", "runtime.cli", args[0], "--coordinator", f"{host}:{port}",
                           "--token-file", cluster.token_path, *args[1:]],
                          capture_output=True, text=True, timeout=600, env=cluster.env)


DOWNTIME_LINE = re.compile(r"^job \S+ rescaled to .* \(attempt (\d+)\) from checkpoint (\d+).*: downtime ([\d.]+)s$")


async def _rescale_cli(cluster: LocalCluster, job_id: str, parallelism: int) -> dict[str, Any]:
    """`sluice rescale` itself: one line with the downtime; a refusal (too many slots) one line on stderr."""
    refused = await asyncio.to_thread(_cli, cluster, "rescale", job_id, "--parallelism", str(WORKERS * SLOTS + 1))
    refusal = refused.stderr.strip().splitlines()
    if refused.returncode != 1 or refused.stdout or len(refusal) != 1:
        raise RuntimeError(f"a refused rescale printed {refused.stdout!r} {refused.stderr!r} "
                           f"(status {refused.returncode})")
    proc = await asyncio.to_thread(_cli, cluster, "rescale", job_id, "--parallelism", str(parallelism))
    lines = proc.stdout.strip().splitlines()
    match = DOWNTIME_LINE.match(lines[0]) if len(lines) == 1 else None
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"sluice rescale printed {proc.stdout!r} {proc.stderr!r} (status {proc.returncode})")
    return {"attempt": int(match.group(1)), "checkpoint_id": int(match.group(2)), "downtime_s": float(match.group(3)),
            "cli_line": lines[0], "cli_refusal": refusal[0]}


async def _one_rescale(cluster: LocalCluster, job_id: str, progress: str, parallelism: int, use_cli: bool,
                       timeout_s: float) -> dict[str, Any]:
    t_req = time.time()
    m_req = time.monotonic()  # CLOCK_MONOTONIC is system-wide: comparable with the coordinator's checkpoint times
    if use_cli:  # the refusal, then the rescale; the times include both commands' start-up (not summarised)
        answer = await _rescale_cli(cluster, job_id, parallelism)
    else:
        host, port = cluster.rpc  # cluster.call's 30 s is too short for an aligned checkpoint behind full queues
        answer = await call_coordinator(host, port, cluster.token, "rescale",
                                        {"job_id": job_id, "parallelism": {"*": parallelism}, "timeout_s": timeout_s},
                                        timeout_s=timeout_s + 30.0)
    t_answer = time.time()
    attempt = answer["attempt"]
    deadline = time.monotonic() + timeout_s
    while True:
        opened, first = first_output(progress, attempt)
        if first is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no output from attempt {attempt} within {timeout_s}s of the rescale")
        await asyncio.sleep(0.01)
    history = (await cluster.call("checkpoints", {"job_id": job_id}))["history"]
    chk = next(h for h in history if h["checkpoint_id"] == answer["checkpoint_id"])
    t_stop = t_answer - answer["downtime_s"]
    return {"to": parallelism, "attempt": attempt, "checkpoint_id": answer["checkpoint_id"], "mode": chk["mode"],
            "state_bytes": chk["state_bytes"], "inflight_bytes": chk["inflight_bytes"],
            "checkpoint_s": chk["started_at"] + chk["duration_s"] - m_req,
            "downtime_s": answer["downtime_s"], "request_to_running_s": t_answer - t_req,
            "request_to_first_output_s": first - t_req, "stop_to_first_output_s": first - t_stop,
            "stop_to_sink_open_s": None if opened is None else opened - t_stop,
            **({"cli": True, "cli_line": answer["cli_line"], "cli_refusal": answer["cli_refusal"]} if use_cli else {})}


async def _one_upgrade(cluster: LocalCluster, job_id: str, progress: str, parallelism: int,
                       timeout_s: float) -> dict[str, Any]:
    t_req = time.time()
    host, port = cluster.rpc
    answer = await call_coordinator(host, port, cluster.token, "upgrade",
                                    {"job_id": job_id, "entry": ENTRY, "parallelism": {"*": parallelism},
                                     "timeout_s": timeout_s}, timeout_s=timeout_s + 30.0)
    t_answer = time.time()
    t_stop = t_answer - answer["downtime_s"]
    deadline = time.monotonic() + timeout_s
    while True:  # the new job's attempts count from 0 again: its first output is the first one after the stop
        first = first_after(progress, t_stop)
        if first is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no output from the upgraded job within {timeout_s}s")
        await asyncio.sleep(0.01)
    history = (await cluster.call("checkpoints", {"job_id": job_id}))["history"]
    chk = next(h for h in history if h["checkpoint_id"] == answer["checkpoint_id"])
    return {"to": parallelism, "attempt": 0, "checkpoint_id": answer["checkpoint_id"], "mode": "savepoint",
            "job_id": answer["job_id"], "state_bytes": chk["state_bytes"], "inflight_bytes": chk["inflight_bytes"],
            "checkpoint_s": answer["savepoint_s"], "downtime_s": answer["downtime_s"],
            "request_to_running_s": t_answer - t_req, "request_to_first_output_s": first - t_req,
            "stop_to_first_output_s": first - t_stop, "stop_to_sink_open_s": None}


async def _measure(cluster: LocalCluster, workdir: str, progress: str, mode: str, buffers: int, repeat: int,
                   warmup_s: float, between_s: float, use_cli: bool, timeout_s: float,
                   upgrade: bool = False) -> list[dict[str, Any]]:
    await cluster.wait_workers()
    submitted = await cluster.call("submit", {"entry": ENTRY, "name": f"bench-rescale-{mode}-{buffers}",
                                              "config": job_config(mode, buffers, timeout_s), "sys_path": workdir})
    job_id = submitted["job_id"]
    rescales = []
    try:
        await _wait_backpressured(cluster, job_id, 2, warmup_s, timeout_s)
        for i in range(repeat + use_cli):
            to = SHAPES[i % len(SHAPES)]
            if upgrade:
                r = await _one_upgrade(cluster, job_id, progress, to, timeout_s)
                job_id = r["job_id"]
            else:
                r = await _one_rescale(cluster, job_id, progress, to, use_cli and i == 0, timeout_s)
            rescales.append(r)
            await _wait_backpressured(cluster, job_id, to, between_s, timeout_s)
    finally:
        try:
            await cluster.call("cancel", {"job_id": job_id})
        except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
            pass
    return rescales


def run_config(mode: str, keys: int, buffers: int, *, repeat: int, pad: int, sink_delay_s: float, warmup_s: float,
               between_s: float, use_cli: bool, timeout_s: float, keep: bool,
               say: Any, upgrade: bool = False) -> list[dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="sluice-bench-rescale-")
    with open(os.path.join(workdir, f"{MODULE}.py"), "w", encoding="utf-8") as f:
        f.write(JOB)
    progress = os.path.join(workdir, "progress.txt")
    os.environ.update({"SLUICE_RECOVERY_KEYS": str(keys), "SLUICE_RECOVERY_PAD": str(pad),
                       "SLUICE_RECOVERY_SINK_DELAY_S": repr(sink_delay_s), "SLUICE_RECOVERY_PROGRESS": progress,
                       "SLUICE_RECOVERY_EVERY": "1000000000"})  # inherited by the cluster's processes
    load = machine_load()
    cwd = os.getcwd()
    os.chdir(workdir)  # the cluster's processes get it on PYTHONPATH
    cluster = LocalCluster(workers=WORKERS, slots=SLOTS, log_dir=os.path.join(workdir, "logs"),
                           state_dir=os.path.join(workdir, "state"))
    try:
        # PaddedCount fills its state in open(), on the worker's loop: 500 k keys on a loaded machine outlast the
        # default 10 s heartbeat timeout, and a lost worker before the first checkpoint restarts the warm-up
        cluster.start_coordinator("--heartbeat-timeout", "60s")
        for _ in range(WORKERS):
            cluster.start_worker()
        runs = asyncio.run(_measure(cluster, workdir, progress, mode, buffers, repeat, warmup_s, between_s,
                                    use_cli and not upgrade, timeout_s, upgrade))
    except BaseException as exc:
        exc.add_note(f"cluster logs and progress file kept in {workdir}")
        raise
    finally:
        cluster.stop()
        os.chdir(cwd)
    for i, r in enumerate(runs):
        r.update({"mode_asked": f"{mode} upgrade" if upgrade else mode, "keys": keys, "buffers": buffers,
                  "load_before": load})
        say(_run_line(r, i))
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


# -- driver ------------------------------------------------------------------------------------------------


def _run_line(r: dict[str, Any], i: int) -> str:
    label = "CLI rescale" if r.get("cli") else f"{'upgrade' if 'upgrade' in r['mode_asked'] else 'rescale'} {i + 1}"
    line = (f"  {r['mode_asked']:<9} keys {r['keys']:>9,} buffers {r['buffers']:>2} {label} -> {r['to']}: "
            f"chk #{r['checkpoint_id']} ({r['mode']}) state {_bytes(r['state_bytes'])} in-flight "
            f"{_bytes(r['inflight_bytes'])}; checkpoint {_s(r['checkpoint_s'])}, downtime {_s(r['downtime_s'])}, "
            f"request->running {_s(r['request_to_running_s'])}, request->first output "
            f"{_s(r['request_to_first_output_s'])}, stop->first output {_s(r['stop_to_first_output_s'])}")
    return line + (f"\n    CLI: {r['cli_line']!r}; refused: {r['cli_refusal']!r}" if "cli_line" in r else "")


FIGURES = ("state_bytes", "inflight_bytes", "checkpoint_s", "downtime_s", "request_to_running_s",
           "request_to_first_output_s", "stop_to_first_output_s")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    key = lambda r: (r["mode_asked"], r["keys"], r["buffers"])  # noqa: E731
    for (mode, keys, buffers), grouped in itertools.groupby(sorted(runs, key=key), key=key):
        group = list(grouped)
        ok = [r for r in group if "error" not in r and not r.get("cli")]
        row: dict[str, Any] = {"mode": mode, "keys": keys, "buffers": buffers, "runs": len(ok),
                               "failed": sum("error" in r for r in group)}
        row.update({f: _median([r[f] for r in ok]) for f in FIGURES})
        row["downtime_max_s"] = max((r["downtime_s"] for r in ok), default=None)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| mode | keys | buffers | state | in-flight | checkpoint | downtime (stop -> running) | request -> running "
           "| request -> first output | stop -> first output | rescales |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        out.append(f"| {r['mode']} | {r['keys']:,} | {r['buffers']} | {_bytes(r['state_bytes'])} | "
                   f"{_bytes(r['inflight_bytes'])} | {_s(r['checkpoint_s'])} | {_s(r['downtime_s'])} | "
                   f"{_s(r['request_to_running_s'])} | {_s(r['request_to_first_output_s'])} | "
                   f"{_s(r['stop_to_first_output_s'])} | {r['runs']}{failed} |")
    return out


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aligned over unaligned, per (keys, buffers), for request -> running and request -> first output."""
    by = {(r["mode"], r["keys"], r["buffers"]): r for r in rows}
    out = []
    for (mode, keys, buffers), a in by.items():
        u = by.get(("unaligned", keys, buffers))
        if mode != "aligned" or u is None:
            continue
        out.append({"keys": keys, "buffers": buffers,
                    **{f: (a[f] / u[f]) if a[f] and u[f] else None
                       for f in ("request_to_running_s", "request_to_first_output_s")}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="unaligned,aligned", help="checkpoint modes (default unaligned,aligned)")
    parser.add_argument("--keys", default="1000,100000,1000000", help="key counts: state size")
    parser.add_argument("--buffers", default="4,32", help="buffers per channel: in-flight data (default 4,32)")
    parser.add_argument("--repeat", type=int, default=5, help="rescales per configuration (default 5)")
    parser.add_argument("--pad", type=int, default=24, help="bytes of padding in each key's value (default 24)")
    parser.add_argument("--sink-delay-us", type=float, default=50.0, help="sink delay per record (default 50 us)")
    parser.add_argument("--warmup", type=float, default=2.0, help="backpressured seconds before the first rescale")
    parser.add_argument("--between", type=float, default=1.0, help="backpressured seconds between rescales")
    parser.add_argument("--cli", action="store_true", help="one more rescale per configuration, first, runs "
                        "`sluice rescale` (and a refused one) and checks what it prints; not in the medians")
    parser.add_argument("--upgrade", action="store_true", help="measure `sluice upgrade` (savepoint, cancel, "
                        "submit from it) at each step instead of `sluice rescale`")
    parser.add_argument("--inflight-target", type=float, default=INFLIGHT_TARGET_S, metavar="SECONDS",
                        help="the job's inflight_target_s (default 0: off, fixed-size buffers; the runtime's "
                             "default is 1 s)")
    parser.add_argument("--keep", action="store_true", help="keep each configuration's temp dir (logs, progress)")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up on a phase after this many s")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = parser.parse_args(argv)
    global INFLIGHT_TARGET_S  # read by job_config in every configuration below
    INFLIGHT_TARGET_S = args.inflight_target
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    keys = [int(k) for k in args.keys.split(",")]
    buffers = [int(b) for b in args.buffers.split(",")]
    if args.repeat < 1 or not modes or not keys or not buffers:
        parser.error("--repeat must be >= 1 and --modes/--keys/--buffers non-empty")

    def say(text: str) -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    info = machine()
    say(f"bench_rescale: {len(modes) * len(keys) * len(buffers)} configurations x {args.repeat} rescales "
        f"(2 -> 3 -> 2 ...); {WORKERS} workers x {SLOTS} slots; sink {args.sink_delay_us:g} us/record; "
        f"{info['nproc']} cpus ({info['cpu_model']}), Python {info['python']}; revision {info['revision']}; "
        f"load average {os.getloadavg()[0]:.2f}")
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    for mode, k, b in itertools.product(modes, keys, buffers):
        try:
            runs += run_config(mode, k, b, repeat=args.repeat, pad=args.pad, sink_delay_s=args.sink_delay_us / 1e6,
                               warmup_s=args.warmup, between_s=args.between, use_cli=args.cli,
                               timeout_s=args.timeout, keep=args.keep, say=say, upgrade=args.upgrade)
        except Exception as exc:  # noqa: BLE001 - report it, keep measuring the rest
            err = f"{type(exc).__name__}: {exc} {list(getattr(exc, '__notes__', []))}"
            runs.append({"mode_asked": mode, "keys": k, "buffers": b, "error": err})
            say(f"  {mode:<9} keys {k:>9,} buffers {b:>2}: FAILED: {err}")
    rows = summarise(runs)
    rel = ratios(rows)
    unaligned = [r for r in runs if "error" not in r and not r.get("cli") and r["mode_asked"] == "unaligned"]
    smallest = min(keys)
    small_downtimes = [r["downtime_s"] for r in unaligned if r["keys"] == smallest]
    result = {"benchmark": "rescale", "machine": info, "workers": WORKERS, "slots": SLOTS,
              "sink_delay_us": args.sink_delay_us, "pad": args.pad, "repeat": args.repeat,
              "load_average_end": os.getloadavg(), "total_s": time.monotonic() - started,
              "summary": rows, "ratios": rel, "runs": runs}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("medians:")
    for line in table(rows):
        print(line)
    for r in rel:
        running, first = r["request_to_running_s"], r["request_to_first_output_s"]
        print(f"aligned / unaligned, keys {r['keys']:,}, buffers {r['buffers']}: request -> running "
              f"{'?' if running is None else f'{running:.1f}x'}, request -> first output "
              f"{'?' if first is None else f'{first:.1f}x'} (target >= {TARGET_RATIO:g}x)")
    if small_downtimes:
        print(f"unaligned downtime with {smallest:,} keys (no restore I/O to speak of): median "
              f"{statistics.median(small_downtimes):.2f} s, worst {max(small_downtimes):.2f} s "
              f"(target <= {TARGET_DOWNTIME_S:g} s plus the restore's I/O)")
    print(f"total {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
