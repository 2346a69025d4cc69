"""Rescaling a running job one of whose tasks has finished (the idea of Flink's FLIP-147), on a real cluster.

Rules broadcast to a keyed stream: the rules source is bounded and short, so it ends and finishes within the
first checkpoints while the events go on, backpressured by a slow sink. The job is rescaled 2 -> 3 (every
operator, the finished rules source too): the checkpoint records the rules task as finished, the new rules
subtasks start finished (their consumers see the end of that input at once) and every new enrich subtask
opens with the broadcast rules of the subtask it continues. Every event comes out exactly once."""

from __future__ import annotations

import json

import pytest

from runtime.connectors.generator import generate_block, key_names
from runtime.graph.enums import JobState
from tests.support.cluster import Cluster, committed_rows, logs, poll, write_module

JOBS = '''
from runtime.api import FileSink, GeneratorSource, Job, KeyedBroadcastProcessFunction
from runtime.examples.connect import RULES


class Enrich(KeyedBroadcastProcessFunction):
    def open(self, ctx):
        ctx.emit(["opened", ctx.subtask_index, ctx.parallelism, sorted(ctx.broadcast_state(RULES).keys())])

    def process_broadcast_element(self, rule, ctx):
        ctx.broadcast_state(RULES).put(rule[0], rule[1])

    def process_element(self, event, ctx):
        ctx.emit(["event", event[0], len(ctx.broadcast_state(RULES).items())])


def pipeline(job: Job) -> None:
    events = job.source(GeneratorSource(count={ids}, keys=100, seed=1), name="events", parallelism=2) \\
        .map(lambda r: (r[1], r[0]), name="event")
    rules = job.source(GeneratorSource(count={rules}, keys=5, seed=0), name="rules", parallelism=1) \\
        .map(lambda r: (r[0], 1), name="rule")
    (events.key_by(lambda e: e[0]).connect(rules.broadcast(RULES))
        .process(Enrich(), name="enrich", parallelism=2)
        .sink(FileSink({out!r}, delay_per_record_s=0.0004), name="sink"))
'''
IDS, RULES_SENT = 24_000, 40
CONFIG = {"checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 30.0, "min_pause_s": 0,
                         "tolerable_failures": 3, "retain": 3},
          "buffer_bytes": 2048, "buffers_per_channel": 2, "inflight_target_s": 0}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_broadcast_job_whose_rules_source_finished_is_rescaled_2_3_with_exact_output(
        running_cluster: Cluster) -> None:
    cluster = running_cluster
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "finishedjobs", JOBS.format(ids=IDS, rules=RULES_SENT, out=str(out)))
    job_id = str(cluster.call("submit", {"entry": "finishedjobs:pipeline", "config": CONFIG,
                                         "sys_path": str(cluster.tmp_path)})["job_id"])

    def rules_finished() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in (JobState.DEPLOYING, JobState.RUNNING), (st, logs(cluster))
        return st["state"] == JobState.RUNNING and st["tasks_finished"] >= 1

    poll(rules_finished, 30, "the rules task to finish")
    st = cluster.call("status", {"job_id": job_id})
    assert st["tasks_finished"] == 1 and sum(t["records_out"] for t in st["tasks"]) < IDS, st  # events go on
    result = cluster.call("rescale", {"job_id": job_id, "parallelism": {"*": 3}})
    assert {v["name"]: v["parallelism"] for v in result["vertices"]} == {
        "events -> event": 3, "rules -> rule": 3, "enrich -> sink": 3}, result
    final = cluster.wait_job(job_id, timeout_s=60)
    assert final["state"] == JobState.FINISHED and final["attempt"] == 1 and final["restarts"] == 0, (
        final, logs(cluster))
    poll(lambda: not committed_rows(out)[1], 15, "the final commit (no in-progress files left)")
    rows = [json.loads(line) for line, n in committed_rows(out)[0].items() for _ in range(n)]
    ids = [r[1] for r in rows if r[0] == "event"]
    assert len(ids) == len(set(ids)) == IDS, (len(ids), len(set(ids)))
    # the three subtasks after the rescale opened with every rule (the third continues subtask 0's state)
    names = sorted({r[0] for r in generate_block(0, seed=0, keys=key_names(5), cum_weights=None, count=RULES_SENT)})
    opened = sorted((r[1], r[2], r[3]) for r in rows if r[0] == "opened" and r[2] == 3)
    assert opened == [(i, 3, names) for i in range(3)], opened
    print(f"rescaled from checkpoint {result['checkpoint_id']} down {result['downtime_s']:.3f}s, "
          f"inflight {result['inflight_bytes']} bytes")
