"""The commands that ask a running coordinator: submit, status, cancel, checkpoint, savepoint, rescale, upgrade,
checkpoints, probe. Each sends one typed request (runtime/graph/protocol.py) to the leading coordinator and
prints its answer."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TypeVar

from netstack.transport import run
from runtime.cli import arguments as a
from runtime.cli.command import Command
from runtime.cli.job_options import add_job_options, submit_message
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.config import load_token


def client_token(args: argparse.Namespace) -> str:
    if args.token_file is None and args.state_dir is not None:
        return load_token(os.path.join(args.state_dir, "token"))
    return load_token(args.token_file)


R = TypeVar("R", bound=r.Reply)


def request(args: argparse.Namespace, message: p.Message[R], timeout_s: float = 30.0) -> R:
    """Send `message` to the leading coordinator of --coordinator; its typed answer."""
    from runtime.cli.client import ask_leader

    return run(ask_leader(args.coordinator, client_token(args), message, tls=a.tls(args), timeout_s=timeout_s))


def print_job(summary: r.JobSummary) -> None:
    print(f"job {summary.job_id}  {summary.state}  ({summary.name})")
    if summary.error:
        print(f"  error: {summary.error}")
    print(f"  tasks finished {summary.tasks_finished}/{summary.tasks_total}")
    if summary.final_checkpoint_id is not None:
        print(f"  final checkpoint {summary.final_checkpoint_id}")
    for v in summary.vertices:
        asked = v.get("asked_parallelism", v["parallelism"])
        print(f"  {v['name']:<40} parallelism {v['parallelism']}" + (f" (asked {asked})" if asked != v["parallelism"]
                                                                       else ""))
    if summary.scaling.get("reason"):
        print(f"  {summary.scaling['reason']}")
    autoscaler = summary.autoscaler
    if autoscaler.get("enabled"):
        last = autoscaler["decisions"][-1] if autoscaler.get("decisions") else None
        print(f"  autoscaler{' (dry run)' if autoscaler.get('dry_run') else ''}: {autoscaler.get('status')}"
              + (f"; last decision {last['vertex']} {last['from']} -> {last['to']} ({last['outcome']}): "
                 f"{last['reason']}" if last else ""))
    for t in summary.tasks:
        print(f"  {t['task']:<22} {t['state']:<9} in {t['records_in']:>12,} out {t['records_out']:>12,} "
              f"busy {t['busy_s']:7.1f}s idle {t['idle_s']:7.1f}s backpressured {t['backpressured_s']:7.1f}s "
              f"on {t.get('worker', '?')}")


# -- submit ------------------------------------------------------------------------------------------------------


def _submit_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("entry", metavar="MODULE:FUNCTION", nargs="?")
    s.add_argument("--sql", metavar="FILE.sql", help="submit a Flink SQL script instead of a job module (README, SQL)")
    s.add_argument("--wait", action="store_true", help="wait for the job to end; exit non-zero unless it FINISHED")
    s.add_argument("--wait-timeout", type=a.duration, default=None, metavar="DURATION",
                   help="with --wait: give up after this long (exit 1, the job keeps running); default: no limit")
    add_job_options(s)


def run_submit(args: argparse.Namespace) -> int:
    if (args.sql is None) == (args.entry is None):
        print("sluice submit: give a job entry MODULE:FUNCTION or --sql FILE.sql", file=sys.stderr)
        return 2
    if args.sql is not None:
        from runtime.cli.sql_command import prepare

        problem = prepare(args, args.sql)
        if problem:
            print(f"sluice submit: {problem}", file=sys.stderr)
            return 2
    result = request(args, submit_message(args))
    print(f"submitted {result.job_id} ({result.tasks} tasks)")
    return _wait_for(args, result.job_id) if args.wait else 0


def _wait_for(args: argparse.Namespace, job_id: str) -> int:
    from runtime.cli.client import JOB_ENDED, wait_job_on_leader

    summary = run(wait_job_on_leader(args.coordinator, client_token(args), job_id, timeout_s=args.wait_timeout,
                                     tls=a.tls(args)))
    print_job(summary)
    if summary.state not in JOB_ENDED:
        print(f"sluice submit: job {job_id} is still {summary.state} after --wait-timeout "
              f"{args.wait_timeout:g}s", file=sys.stderr)
    return 0 if summary.state == "FINISHED" else 1


# -- status, cancel ----------------------------------------------------------------------------------------------


def _status_arguments(st: argparse.ArgumentParser) -> None:
    st.add_argument("job_id", nargs="?")
    st.add_argument("--json", action="store_true")


def run_status(args: argparse.Namespace) -> int:
    result: r.JobSummary | r.ClusterOverview
    result = request(args, p.JobStatus(args.job_id)) if args.job_id else request(args, p.Overview())
    if args.json:
        print(json.dumps(result.to_wire(), indent=2))
    elif isinstance(result, r.JobSummary):
        print_job(result)
    else:
        _print_overview(result)
    return 0


def _print_overview(result: r.ClusterOverview) -> None:
    if result.coordinator is not None:
        c = result.coordinator
        print(f"coordinator {c['id']}  lease epoch {c['epoch']}  recovered jobs {c['recovered_jobs']}")
    print(f"workers: {len(result.workers)}")
    for w in result.workers:
        print(f"  {w['id']:<24} slots {w['slots']}  data {w['data']}  metrics {w['metrics_port']}")
    print(f"jobs: {len(result.jobs)}")
    for j in result.jobs:
        err = f"  ({j['error']})" if j["error"] else ""
        print(f"  {j['job_id']}  {j['state']:<10} {j['name']}{err}")


def _job_id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id")


def _cancel_arguments(ca: argparse.ArgumentParser) -> None:
    ca.add_argument("job_id")
    ca.add_argument("--savepoint", action="store_true",
                    help="take a savepoint first and cancel the job only once it completed; print its path")
    ca.add_argument("--dir", help="where the savepoint goes, inside one of the coordinator's --savepoint-root "
                    "(default: the first root)")
    ca.add_argument("--timeout", type=a.duration, default=600.0, help="give up waiting after (600s)")


def run_cancel(args: argparse.Namespace) -> int:
    if args.savepoint:
        message = p.Cancel(job_id=args.job_id, savepoint=True, directory=a.absolute(args.dir),
                           timeout_s=args.timeout)
        result = request(args, message, timeout_s=args.timeout + 60.0)
        print(f"job {args.job_id}: {result.state}, stopped with savepoint {result.savepoint}")
        return 0
    result = request(args, p.Cancel(job_id=args.job_id))
    print(f"job {args.job_id}: {result.state}")
    return 0


# -- checkpoint, savepoint, checkpoints ------------------------------------------------------------------------


def _checkpoint_arguments(cp: argparse.ArgumentParser) -> None:
    cp.add_argument("job_id")
    cp.add_argument("--mode", choices=["aligned", "unaligned", "at-least-once"], help="override the job's mode")


def run_checkpoint(args: argparse.Namespace) -> int:
    mode = args.mode.replace("-", "_") if args.mode else None
    return _checkpoint_ended(args, request(args, p.TakeCheckpoint(job_id=args.job_id, mode=mode)))


def _savepoint_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("job_id")
    sp.add_argument("--dir", help="directory to write it under, inside one of the coordinator's --savepoint-root "
                    "(default: the first root)")


def run_savepoint(args: argparse.Namespace) -> int:
    message = p.TakeCheckpoint(job_id=args.job_id, savepoint=True, directory=a.absolute(args.dir))
    return _checkpoint_ended(args, request(args, message))


def _checkpoint_ended(args: argparse.Namespace, result: r.CheckpointDone) -> int:
    if result.completed:
        print(f"{args.command} {result.checkpoint_id} completed: {result.path}")
        return 0
    print(f"{args.command} {result.checkpoint_id} aborted: {result.reason or ''}", file=sys.stderr)
    return 1


def _checkpoints_arguments(cl: argparse.ArgumentParser) -> None:
    cl.add_argument("job_id")
    cl.add_argument("--json", action="store_true")


def run_checkpoints(args: argparse.Namespace) -> int:
    result = request(args, p.Checkpoints(job_id=args.job_id))
    if args.json:
        print(json.dumps(result.to_wire(), indent=2))
        return 0
    print(f"{'id':>5} {'status':<11} {'mode':<15} {'duration':>9} {'alignment':>9} {'state':>10} "
          f"{'in-flight':>10}  note")
    for h in result.history:
        duration = f"{h['duration_s']:.3f}s" if h["duration_s"] is not None else "-"
        kind = "savepoint " if h["savepoint"] else ""
        switched = h.get("switched_channels") or 0  # per-channel switching: channels switched to unaligned
        kind += f"switched {switched} channels " if switched else ""
        print(f"{h['checkpoint_id']:>5} {h['status']:<11} {h['mode']:<15} {duration:>9} "
              f"{h['alignment_s']:>8.3f}s {h['state_bytes']:>10,} {h['inflight_bytes']:>10,}  "
              f"{kind}{h['failure_reason']}")
    for kept in result.retained:
        print(f"retained: chk-{kept['checkpoint_id']} {kept['path']}")
    return 0


# -- rescale, upgrade --------------------------------------------------------------------------------------------


def _rescale_arguments(rs: argparse.ArgumentParser) -> None:
    rs.add_argument("job_id")
    rs.add_argument("--parallelism", metavar="N|NAME=N", type=a.parallelism, action="append", required=True,
                    help="every operator (N) or the one named NAME (NAME=N, repeatable) at this parallelism")
    rs.add_argument("--timeout", type=a.duration, default=600.0, help="give up waiting after (600s)")


def run_rescale(args: argparse.Namespace) -> int:
    result = request(args, p.Rescale(job_id=args.job_id, parallelism=dict(args.parallelism), timeout_s=args.timeout),
                     timeout_s=args.timeout + 60.0)
    inflight = f", {result.inflight_bytes:,} bytes in flight" if result.inflight_bytes else ""
    shape = ", ".join(f"{v['name']}={v['parallelism']}" for v in result.vertices)
    print(f"job {result.job_id} rescaled to {shape} (attempt {result.attempt}) from checkpoint "
          f"{result.checkpoint_id}{inflight}: downtime {result.downtime_s:.3f}s")
    return 0


def _upgrade_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument("job_id")
    up.add_argument("entry", help="the new version, package.module:function (imported from this directory)")
    up.add_argument("--parallelism", metavar="N|NAME=N", type=a.parallelism, action="append", default=[],
                    help="as in rescale; default: the running job's")
    up.add_argument("--allow-non-restored-state", action="store_true",
                    help="drop the state of operators (by uid) the new version no longer has")
    up.add_argument("--dir", help="where the savepoint goes, inside one of the coordinator's --savepoint-root "
                    "(default: the first root)")
    up.add_argument("--name", help="the new job's name (default: the running job's)")
    up.add_argument("--timeout", type=a.duration, default=600.0, help="give up waiting after (600s)")


def run_upgrade(args: argparse.Namespace) -> int:
    message = p.Upgrade(job_id=args.job_id, entry=args.entry, name=args.name, sys_path=os.getcwd(),
                        parallelism=dict(args.parallelism), allow_non_restored_state=args.allow_non_restored_state,
                        directory=a.absolute(args.dir), timeout_s=args.timeout)
    result = request(args, message, timeout_s=args.timeout + 60.0)
    shape = ", ".join(f"{v['name']}={v['parallelism']}" for v in result.vertices)
    print(f"job {result.previous_job_id} upgraded to {result.job_id} ({shape}) from savepoint "
          f"{result.savepoint} (taken in {result.savepoint_s:.3f}s): downtime {result.downtime_s:.3f}s")
    return 0


# -- probe -------------------------------------------------------------------------------------------------------


def run_probe(args: argparse.Namespace) -> int:
    result = request(args, p.Probe(job_id=args.job_id))
    state = "crossed" if result.complete else "did NOT cross"
    print(f"probe {result.probe_id} {state} the job: {len(result.tasks)}/{result.tasks_total} tasks, "
          f"{(result.duration_s or 0) * 1000:.1f} ms")
    for t in result.tasks:
        print(f"  {t['task']:<24} at {t['arrival_s'] * 1000:8.1f} ms  overtook {t['overtaken_output_buffers']} "
              f"output and {t['overtaken_input_buffers']} input buffers")
    return 0 if result.complete else 1


COMMANDS = (
    Command("submit", "submit a job to a running coordinator", _submit_arguments, run_submit, client=True),
    Command("status", "show workers and jobs, or one job in detail", _status_arguments, run_status, client=True),
    Command("cancel", "cancel a job (with --savepoint: stop it with a savepoint)", _cancel_arguments, run_cancel,
            client=True),
    Command("checkpoint", "take a checkpoint of a running job now and wait for it", _checkpoint_arguments,
            run_checkpoint, client=True),
    Command("savepoint", "take an aligned, self-contained savepoint of a running job", _savepoint_arguments,
            run_savepoint, client=True),
    Command("rescale", "rescale a running job through a checkpoint of its mode; print the downtime",
            _rescale_arguments, run_rescale, client=True),
    Command("upgrade", "stop a running job with a savepoint and start a new version of it from that savepoint; "
            "print the downtime (README: Evolving a job)", _upgrade_arguments, run_upgrade, client=True),
    Command("checkpoints", "list a job's recent checkpoints with their figures", _checkpoints_arguments,
            run_checkpoints, client=True),
    Command("probe", "send a probe through a running job on the priority lane and time it", _job_id_argument,
            run_probe, client=True),
)
