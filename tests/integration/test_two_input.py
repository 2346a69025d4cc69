"""Two-input tasks on a real cluster (two workers, two slots each, real TCP): connect and broadcast state.

1. Orders joined with payments (KeyedCoProcessFunction), the pairs enriched with rules broadcast to a keyed
   KeyedBroadcastProcessFunction, into a slow file sink: rescaled 2 -> 3 -> 1 while backpressured, through
   unaligned checkpoints with data in flight on both inputs of both two-input tasks. The rules source is short
   and has finished before the rescales, which rescale it too (the idea of Flink's FLIP-147: the checkpoint
   records it as finished, its new subtasks start finished), with a worker killed (kill -9) after the rules
   finished, after the rescale to 3 and after the rescale to 1. Every order id comes out exactly once, and
   every subtask of every attempt after the rules opens with all the rules (the new ones get a copy, the
   restored ones their checkpoint's).
2. One input far slower than the other, the other backpressured: unaligned checkpoints complete in well under
   a second (the barrier overtakes what is queued on both inputs) while an aligned one waits behind the fast
   input's queue until it times out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.connectors.generator import generate_block, key_names
from runtime.graph.enums import JobState
from tests.support.checkpoints import history_entry
from tests.support.cluster import Cluster, committed_rows, kill_worker, logs, poll, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

JOBS = '''
from runtime.api import DiscardSink, FileSink, GeneratorSource, Job, KeyedBroadcastProcessFunction
from runtime.api import KeyedCoProcessFunction
from runtime.examples.connect import RULES, OrderPaymentJoin

RELEASE = {release!r}
''' + RELEASABLE_SINK + '''


class Enrich(KeyedBroadcastProcessFunction):
    """A joined order with the number of rules known and the names of those its id breaks; an "opened" row per
    subtask and attempt with the rules it started with."""

    def open(self, ctx):
        ctx.emit(["opened", ctx.subtask_index, ctx.parallelism, sorted(ctx.broadcast_state(RULES).keys())])

    def process_broadcast_element(self, rule, ctx):
        ctx.broadcast_state(RULES).put(rule[0], rule[1])

    def process_element(self, joined, ctx):
        rules = ctx.broadcast_state(RULES)
        broken = sorted(name for name, limit in rules.items() if joined[0] % 1000 > limit)
        ctx.emit(["joined", *joined, len(rules), broken])


class CountBoth(KeyedCoProcessFunction):
    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process1(self, record, ctx):
        self.n.update(self.n.value() + 1)
        ctx.emit((record[0], 1, self.n.value()))

    def process2(self, record, ctx):
        self.n.update(self.n.value() + 1)
        ctx.emit((record[0], 2, self.n.value()))


def pipeline(job: Job) -> None:
    orders = job.source(GeneratorSource(count={ids}, keys=100, seed=1), name="orders", parallelism=2) \\
        .map(lambda r: (r[1], r[0]), name="order")
    payments = job.source(GeneratorSource(count={ids}, keys=3, seed=2), name="payments", parallelism=2) \\
        .map(lambda r: (r[1], r[0]), name="payment")
    # rule k<i>: order ids over i * 200 (mod 1000) break it; all five are out after 26 records, and the source
    # ends long before the rescales (which rescale it, finished, too)
    rules = job.source(GeneratorSource(count={rules}, keys=5, seed=0), name="rules", parallelism=1) \\
        .map(lambda r: (r[0], int(r[0][1:]) * 200), name="rule")
    joined = orders.key_by(lambda o: o[0]).connect(payments.key_by(lambda p: p[0])) \\
        .process(OrderPaymentJoin(), name="join", parallelism=2)
    (joined.key_by(lambda j: j[0]).connect(rules.broadcast(RULES))
        .process(Enrich(), name="enrich", parallelism=2)
        .sink(ReleasableSink({out!r}, delay_per_record_s=0.0005), name="sink"))


def slow_input(job: Job) -> None:
    fast = job.source(GeneratorSource(count=None, keys=1000, seed=3), name="fast", parallelism=2)
    slow = job.source(GeneratorSource(count=None, keys=1000, seed=4, records_per_second=50), name="slow",
                      parallelism=2)
    (fast.key_by(lambda r: r[0]).connect(slow.key_by(lambda r: r[0]))
        .process(CountBoth(), name="count", parallelism=2)
        .sink(DiscardSink(delay_per_record_s=0.0002), name="sink"))
'''

IDS = 40_000  # the sources run ~10k ids ahead of the sink (queues, join state): they must not end before the rescales
RULES_SENT = 40
RULE_NAMES = [f"k{i}" for i in range(5)]
# small buffers for the pipeline: a few thousand rows fill its queues, so its two-input tasks are backpressured
# and a rescale's checkpoint has data in flight on both of their inputs; big ones for the slow-input job, so
# that an aligned barrier waits seconds behind the fast input's queue
SMALL = {"buffer_bytes": 2048, "buffers_per_channel": 2, "inflight_target_s": 0}
BIG = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4, "inflight_target_s": 0}


def config(mode: str, interval_s: float | None, channels: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    return {"checkpoint": {"interval_s": interval_s, "mode": mode, "timeout_s": timeout_s, "min_pause_s": 0,
                           "tolerable_failures": 3, "retain": 3}, **channels}


def submit(cluster: Cluster, entry: str, cfg: dict[str, Any]) -> tuple[str, Path]:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "twoinputjobs", JOBS.format(ids=IDS, rules=RULES_SENT, out=str(out),
                                                                    release=release_path(cluster)))
    result = cluster.call("submit", {"entry": f"twoinputjobs:{entry}", "config": cfg,
                                     "sys_path": str(cluster.tmp_path)})
    return str(result["job_id"]), out


def tasks_by_operator(status: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for t in status["tasks"]:
        out.setdefault(t["name"].rsplit(" (", 1)[0], []).append(t)
    return out


def wait_backpressured(cluster: Cluster, job_id: str, operator: str, tasks: int) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in (JobState.DEPLOYING, JobState.RESTARTING, JobState.RUNNING), (st, logs(cluster))
        return st["state"] == JobState.RUNNING and len(tasks_by_operator(st).get(operator, [])) == tasks

    def backpressured() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] == JobState.RUNNING, (st, logs(cluster))
        return sum(t["backpressured_s"] for t in tasks_by_operator(st)[operator]) >= 0.3

    poll(running, 60, f"job {job_id} to run {tasks} {operator} tasks")
    poll(backpressured, 30, f"{operator} to be backpressured")


def rescale(cluster: Cluster, job_id: str, parallelism: int) -> dict[str, Any]:
    """Every operator, the finished rules source too, to `parallelism`, through an unaligned checkpoint with data
    in flight."""
    result = cluster.call("rescale", {"job_id": job_id, "parallelism": {"*": parallelism}})
    assert result["mode"] == "unaligned" and result["inflight_bytes"] > 0, result
    assert {v["name"]: v["parallelism"] for v in result["vertices"]} == {
        "orders -> order": parallelism, "payments -> payment": parallelism, "rules -> rule": parallelism,
        "join": parallelism, "enrich -> sink": parallelism}, result
    return result


def kill_and_recover(cluster: Cluster, job_id: str, parallelism: int, *, backpressured: bool = True) -> None:
    """kill -9 a worker hosting an enrich subtask and start it again under its id; the job restarts
    from its latest checkpoint and runs its join at `parallelism` again (backpressured, unless told not to wait)."""
    found: dict[str, Any] = {}

    def hosting() -> bool:  # right after a restart the tasks have not reported yet
        found.update(cluster.call("status", {"job_id": job_id}))
        return any(t["name"].startswith("enrich") and t["state"] == "running" for t in found["tasks"])

    poll(hosting, 60, "an enrich task to run")
    st = dict(found)
    victim = min((t["task"], t["worker"]) for t in st["tasks"]
                 if t["name"].startswith("enrich") and t["state"] == "running")[1]
    kill_worker(cluster, victim)
    cluster.start_worker(worker_id=victim)
    poll(lambda: cluster.call("status", {"job_id": job_id})["attempt"] > st["attempt"], 60,
         f"job {job_id} to restart after worker {victim} was killed")
    if backpressured:
        wait_backpressured(cluster, job_id, "join", parallelism)


def expected_pairs() -> dict[int, tuple[str, str]]:
    customers, methods = key_names(100), key_names(3)
    orders = [r for b in range(-(-IDS // 1024))
              for r in generate_block(b, seed=1, keys=customers, cum_weights=None, count=IDS)]
    payments = [r for b in range(-(-IDS // 1024))
                for r in generate_block(b, seed=2, keys=methods, cum_weights=None, count=IDS)]
    return {o[1]: (o[0], p[0]) for o, p in zip(orders, payments, strict=True)}


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_join_and_broadcast_state_rescaled_2_3_1_under_three_kills_are_exact(running_cluster: Cluster) -> None:
    cluster = running_cluster
    t0 = time.monotonic()
    restarts = {"restart": {"kind": "fixed", "max_attempts": 5, "delay_s": 0.2, "slot_wait_s": 60}}
    job_id, out = submit(cluster, "pipeline", {**config("unaligned", 0.5, SMALL), **restarts})
    wait_backpressured(cluster, job_id, "join", 2)
    poll(lambda: cluster.call("status", {"job_id": job_id})["tasks_finished"] >= 1, 30, "the rules task to finish")
    done = cluster.call("status", {"job_id": job_id})["checkpoints_completed"]
    poll(lambda: cluster.call("status", {"job_id": job_id})["checkpoints_completed"] >= done + 2, 30,
         "two checkpoints after the rules (every subtask has taken them in by then)")
    st = cluster.call("status", {"job_id": job_id})
    # only the rules task has finished: the orders and payments go on (the rescales find data in flight)
    assert st["state"] == JobState.RUNNING and st["tasks_finished"] == 1, st
    phases = [f"rules finished {time.monotonic() - t0:.1f}s"]
    kill_and_recover(cluster, job_id, 2)  # restored with the rules in its broadcast state, the rules task finished
    phases.append(f"killed and recovered {time.monotonic() - t0:.1f}s")
    downtimes = [rescale(cluster, job_id, 3)["downtime_s"]]
    wait_backpressured(cluster, job_id, "join", 3)
    kill_and_recover(cluster, job_id, 3)
    phases.append(f"rescaled to 3, killed and recovered {time.monotonic() - t0:.1f}s")
    downtimes.append(rescale(cluster, job_id, 1)["downtime_s"])
    kill_and_recover(cluster, job_id, 1, backpressured=False)
    phases.append(f"rescaled to 1, killed {time.monotonic() - t0:.1f}s")
    release(cluster)  # the rest of the input at full speed
    final = cluster.wait_job(job_id, timeout_s=120)
    phases.append(f"finished {time.monotonic() - t0:.1f}s")
    # 2 rescales and 3 restarts, each a new attempt
    assert final["state"] == JobState.FINISHED and final["attempt"] == 5 and final["restarts"] == 3, (
        final, logs(cluster))
    poll(lambda: not committed_rows(out)[1], 15, "the final commit (no in-progress files left)")
    rows = [json.loads(line) for line, n in committed_rows(out)[0].items() for _ in range(n)]
    joined = [r for r in rows if r[0] == "joined"]
    opened = [r for r in rows if r[0] == "opened"]
    print(f"{phases}; rescale downtimes {downtimes}, {len(joined)} joined rows, opened {opened}")
    # every order id once, with its own customer and payment method
    pairs = expected_pairs()
    ids = [r[1] for r in joined]
    assert len(ids) == len(set(ids)) == IDS, (len(ids), len(set(ids)))
    assert all(pairs[r[1]] == (r[2], r[3]) for r in joined)
    # every subtask of every parallelism opened (an attempt killed before its first commit left no row); only
    # the first attempt's two, before the rules came, without rules: the new subtasks of both rescales and the
    # restored ones opened with all five; and with them every row is right
    assert {(r[1], r[2]) for r in opened} == {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}, opened
    early = [r for r in opened if r[3] != RULE_NAMES]
    assert len(early) <= 2 and all(r[2] == 2 and r[3] == [] for r in early), opened
    assert all(r[5] == [n for n in RULE_NAMES if r[1] % 1000 > int(n[1:]) * 200] for r in joined if r[4] == 5)
    assert sum(r[4] == 5 for r in joined) > IDS // 2, "most rows were joined after the rules arrived"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_slow_input_beside_a_backpressured_one_unaligned_is_fast_aligned_waits(running_cluster: Cluster) -> None:
    cluster = running_cluster
    job_id, _ = submit(cluster, "slow_input", config("unaligned", None, BIG, timeout_s=3.0))
    wait_backpressured(cluster, job_id, "fast", 2)
    for _ in range(2):
        result = cluster.call("checkpoint", {"job_id": job_id})
        assert result["status"] == "COMPLETED", (result, logs(cluster))
        entry = history_entry(cluster, job_id, result["checkpoint_id"])
        assert entry["mode"] == "unaligned" and entry["duration_s"] < 1.0 and entry["inflight_bytes"] > 0, entry
    t0 = time.monotonic()
    result = cluster.call("checkpoint", {"job_id": job_id, "mode": "aligned"})
    waited = time.monotonic() - t0
    # the slow input's barrier is there at once; the fast one's waits behind seconds of queued records
    assert result["status"] == "ABORTED" and "timeout" in result["reason"], result
    assert waited > 2.5, waited
    assert cluster.call("cancel", {"job_id": job_id})["state"] == JobState.CANCELLED
