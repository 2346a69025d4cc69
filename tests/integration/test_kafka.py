"""The Kafka connector against a real Kafka-protocol broker (noida-db's Kafka service, or a real Apache Kafka
when SLUICE_KAFKA_BOOTSTRAP is set): a job Kafka topic -> keyed count -> Kafka exactly-once whose worker is
killed with SIGKILL mid-run under unaligned checkpoints, read back read_committed exactly (every key's counts
1..n, each once), and its output then read by a second Sluice job through the topic; a broker hung and then
killed with SIGKILL mid-run; a rescale 2 -> 3 -> 1; the connector's own exact replay from a position and its
start positions; a malformed record; a broker down at submit."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.support.cluster import Cluster, kill_sink_worker_after_a_checkpoint, logs, sluice, wait_for, write_module
from tests.support.kafka_broker import KafkaBroker, noida_binary
from tests.support.scrape import scrape

pytest.importorskip("aiokafka", reason="aiokafka is not installed (the `kafka` extra)")

from runtime.connectors import kafka_core  # noqa: E402
from runtime.connectors.kafka_sink import KafkaSink  # noqa: E402
from runtime.connectors.kafka_source import KafkaSource, MalformedRecord  # noqa: E402
from tests.support.kafka_topics import (  # noqa: E402
    add_partitions,
    create_topics,
    end_offsets,
    group_offsets,
    produce,
    read_source,
    read_topic,
    run,
)

pytestmark = pytest.mark.integration

KEYS = 40
PARTITIONS = 4


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    if not os.environ.get("SLUICE_KAFKA_BOOTSTRAP") and noida_binary() is None:
        pytest.skip("noida-db not found: install the test dependencies (noida-db)")
    server = KafkaBroker(tmp_path / "kafka")
    try:
        yield server
    finally:
        server.stop()
        assert server.proc is None or server.proc.poll() is not None, f"broker {server.pid} survived the test"


def input_records(n: int, seed: int = 5) -> list[list[Any]]:
    rng = random.Random(seed)
    return [[f"k{rng.randrange(KEYS):02d}", i] for i in range(n)]


# -- the connector on its own ----------------------------------------------------------------------------------


def test_source_reads_its_partitions_and_replays_exactly_from_a_position(broker: KafkaBroker) -> None:
    bs, topic = broker.bootstrap, broker.topic("in")
    run(create_topics(bs, {topic: PARTITIONS}))
    records = input_records(4000)
    run(produce(bs, topic, records, partitions=PARTITIONS))

    def source() -> KafkaSource:
        return KafkaSource(bs, [topic], bounded=True)

    parts = [read_source(source(), s, 3)[0] for s in range(3)]  # 4 partitions over 3 subtasks
    assert sorted(r for p in parts for r in p) == sorted(tuple(r) for r in records)
    assert sorted(len(p) for p in parts) == [1000, 1000, 2000]
    first, position = read_source(source(), 0, 1, limit=1777)
    rest, end = read_source(source(), 0, 1, position=position)
    assert sorted(first + rest) == sorted(tuple(r) for r in records)
    assert [p[2] for p in end["parts"]] == [1000] * PARTITIONS == [p[3] for p in end["parts"]]  # the bound
    # start positions at the broker: the group's offsets (committed when a checkpoint completes: here, of the
    # position after `first`), explicit offsets (the other partitions at their earliest), latest, a timestamp
    group = broker.topic("group")
    committer = KafkaSource(bs, [topic], bounded=True, group_id=group)
    head, at = read_source(committer, 0, 1, limit=1234, keep_open=True)
    try:
        committer.checkpoint_complete(1, at)
        expected_offsets = {(topic, p[1]): p[2] for p in at["parts"]}
        wait_for(lambda: run(group_offsets(bs, group)) == expected_offsets, 30, "the group's offsets")
    finally:
        committer.close()
    tail, _ = read_source(KafkaSource(bs, [topic], bounded=True, group_id=group, start="committed"), 0, 1)
    assert sorted(head + tail) == sorted(tuple(r) for r in records)
    explicit, _ = read_source(KafkaSource(bs, [topic], bounded=True, start={(topic, 2): 990}), 0, 1)
    assert sorted(i for _, i in explicit) == sorted(i for _, i in records if i % PARTITIONS != 2 or i >= 3960)
    assert read_source(KafkaSource(bs, [topic], bounded=True, start="latest"), 0, 1)[0] == []
    assert len(read_source(KafkaSource(bs, [topic], bounded=True, start={"timestamp_ms": 0}), 0, 1)[0]) == 4000
    # records produced after the bound are not read by a bounded source restored from its position
    run(produce(bs, topic, [["late", 1]], partitions=1))
    again, _ = read_source(source(), 0, 1, position=position)
    assert sorted(again) == sorted(rest)  # partitions interleave as fetches come back; each keeps its order:
    for partition in range(PARTITIONS):
        mine = [i for _, i in again if i % PARTITIONS == partition]
        assert mine == sorted(mine) and mine == [i for _, i in rest if i % PARTITIONS == partition]
    # more subtasks than partitions: the extra one reads nothing and ends
    assert [len(read_source(source(), s, 6)[0]) for s in range(6)].count(0) == 2


def test_partitions_and_topics_that_appear_while_running_are_read(broker: KafkaBroker) -> None:
    """An unbounded source on a topic pattern: partitions added to its topic and a new topic that matches are
    claimed by their owners from their earliest offset, each partition by exactly one of the subtasks."""
    bs = broker.bootstrap
    first, second = broker.topic("disc-a"), broker.topic("disc-b")
    run(create_topics(bs, {first: 2}))
    run(produce(bs, first, [["a", i] for i in range(200)], partitions=2))
    sources = [KafkaSource(bs, topic_pattern=rf"disc-.*-{broker.suffix}", discovery_interval_s=0.2)
               for _ in range(2)]
    for subtask, source in enumerate(sources):
        source.open(subtask, 2)
    got: list[Any] = []

    def read_until(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            for source in sources:
                source.position()
                got.extend(source.read_batch(100) or [])
            time.sleep(0.005)

    try:
        read_until(200)
        run(add_partitions(bs, first, 4))
        run(create_topics(bs, {second: 3}))
        run(produce(bs, first, [["a", i] for i in range(200, 400)], partitions=4))
        run(produce(bs, second, [["b", i] for i in range(300)], partitions=3))
        read_until(700)
        time.sleep(0.5)
        for source in sources:
            source.position()
            assert not source.read_batch(100)
    finally:
        for source in sources:
            source.close()
    assert sorted(got) == sorted([("a", i) for i in range(400)] + [("b", i) for i in range(300)])
    owned = [sorted(p[:2] for p in source.position()["parts"]) for source in sources]
    assert sorted(tp for o in owned for tp in o) == sorted([[first, p] for p in range(4)] +
                                                           [[second, p] for p in range(3)])


def test_a_malformed_record_fails_naming_where_it_is_or_goes_where_the_user_says(broker: KafkaBroker) -> None:
    bs, topic = broker.bootstrap, broker.topic("bad")
    run(create_topics(bs, {topic: 1}))
    run(produce(bs, topic, [], partitions=1, raw=[b'["a",1]', b'{"not json', b'["b",2]']))
    with pytest.raises(MalformedRecord, match=rf"malformed record at {topic}/0/1: JSONDecodeError"):
        read_source(KafkaSource(bs, [topic], bounded=True), 0, 1)
    tagged, _ = read_source(KafkaSource(bs, [topic], bounded=True,
                                        on_malformed=lambda rec, exc: ("malformed", rec.offset, rec.value.decode())),
                            0, 1)
    assert tagged == [("a", 1), ("malformed", 1, '{"not json'), ("b", 2)]
    side, _ = read_source(KafkaSource(bs, [topic], bounded=True, on_malformed="side-output"), 0, 1)
    assert side[0] == ("a", 1) and side[2] == ("b", 2)
    assert (side[1].topic, side[1].partition, side[1].offset, side[1].value) == (topic, 0, 1, b'{"not json')
    assert side[1].error.startswith("JSONDecodeError: ")


def test_sink_modes_and_topic_and_partition_from_the_record(broker: KafkaBroker) -> None:
    """at-least-once: a snapshot returns once the broker acknowledged everything written, each record in the
    partition its function chose; none: sent, not waited for (close flushes at the end of input);
    exactly-once with a topic chosen per record: the commit marker goes to `marker_topic`."""
    bs = broker.bootstrap
    alo, fire, even, odd = (broker.topic(n) for n in ("alo", "none", "even", "odd"))
    run(create_topics(bs, {alo: 2, fire: 2, even: 2, odd: 1}))

    def headers_of(record: Any) -> list[tuple[str, bytes]]:
        return [("n", str(record[1]).encode())]

    base_ms = int(time.time() * 1000) - 60_000  # the records' timestamps, recent (retention goes by them)

    sink = KafkaSink(bs, alo, delivery="at-least-once", key=lambda r: r[0], partition=lambda r: r[1] % 2,
                     headers=headers_of, timestamp=lambda r: base_ms + r[1])
    sink.open(0, 1, 0)
    for i in range(3000):
        sink.write(["k", i])
    assert sink.snapshot_state(1) is None
    assert len(run(read_topic(bs, alo))) == 3000  # acknowledged before the snapshot returned
    sink.close()
    out = run(read_topic(bs, alo))
    assert [(p, v[1] % 2) for p, _, v in out] == [(v[1] % 2, v[1] % 2) for _, _, v in out]
    # what the sink wrote is what a source's deserializer gets: key, headers, timestamp, topic/partition/offset
    def where(rec: Any) -> Any:
        return (rec.topic, rec.partition, rec.offset, rec.key, rec.headers, rec.timestamp_ms, rec.timestamp_type,
                json.loads(rec.value)[1])

    got, _ = read_source(KafkaSource(bs, [alo], bounded=True, deserializer=where), 0, 1)
    assert sorted(got) == sorted((alo, i % 2, i // 2, b"k", (("n", str(i).encode()),), base_ms + i, 0, i)
                                 for i in range(3000))  # the record's timestamp is the sink's, a CreateTime (0)

    sink = KafkaSink(bs, fire, delivery="none")
    sink.open(0, 1, 0)
    for i in range(500):
        sink.write(["k", i])
    sink.finish()
    sink.close()
    assert sorted(v[1] for _, _, v in run(read_topic(bs, fire))) == list(range(500))

    sink = KafkaSink(bs, lambda r: even if r[1] % 2 == 0 else odd, transactional_id_prefix=broker.topic("split"),
                     marker_topic=even)
    sink.open(0, 1, 0)
    for i in range(100):
        sink.write(["k", i])
    sink.snapshot_state(1)
    sink.commit(1)
    sink.finish()
    sink.close()
    assert sorted(v[1] for _, _, v in run(read_topic(bs, even))) == list(range(0, 100, 2))
    assert [v[1] for _, _, v in run(read_topic(bs, odd))] == list(range(1, 100, 2))
    assert run(group_offsets(bs, f"{broker.topic('split')}-sluice-sink-0")) == {(even, 0): 1}


def test_unreachable_broker_is_one_clear_error() -> None:
    source = KafkaSource("127.0.0.1:9", ["t"], connect_timeout_s=2.0)
    with pytest.raises(Exception, match="cannot connect to Kafka at 127.0.0.1:9") as info:
        source.open(0, 1)
    source.close()
    assert type(info.value).__name__ == "KafkaError"
    sink = KafkaSink("127.0.0.1:9", "t", transactional_id_prefix="x", connect_timeout_s=2.0)
    with pytest.raises(Exception, match="cannot connect to Kafka at 127.0.0.1:9"):
        sink.open(0, 1, 0)
    sink.close()


# -- jobs --------------------------------------------------------------------------------------------------------

JOB = '''
import os

from runtime.api import MALFORMED_KAFKA_RECORDS, BoundedOutOfOrderness, Job, KafkaSink, KafkaSource
from runtime.examples.wordcount import Count

BOOTSTRAP, IN, OUT, COPY, SINK_DELAY = {bootstrap!r}, {topic_in!r}, {topic_out!r}, {topic_copy!r}, {sink_delay}
BAD = {topic_bad!r}
RELEASE = {release!r}


def counted(job: Job) -> None:
    source = job.source(KafkaSource(BOOTSTRAP, [IN], group_id="counted-" + IN, bounded=True,
                                    on_malformed="side-output" if BAD else "fail"), parallelism=2).uid("in")
    (source.key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(KafkaSink(BOOTSTRAP, OUT, delivery="exactly-once", transactional_id_prefix="counted-" + OUT,
                        key=lambda r: r[0], delay_per_record_s=SINK_DELAY)))
    if BAD:  # the records the source could not read, exactly once too
        (source.side_output(MALFORMED_KAFKA_RECORDS)
            .map(lambda m: [m.topic, m.partition, m.offset, m.value.decode(), m.error.split(":")[0]])
            .sink(KafkaSink(BOOTSTRAP, BAD, delivery="exactly-once", transactional_id_prefix="bad-" + BAD)))


class ReleasableKafkaSink(KafkaSink):
    """Slow until the test creates RELEASE, so the job is still running at its last rescale."""

    def throttle(self):
        self._throttled = getattr(self, "_throttled", 0) + 1
        if self._throttled % 256 == 0 and self.delay_per_record_s and os.path.exists(RELEASE):
            self.delay_per_record_s = 0.0
        super().throttle()


def rescaled(job: Job) -> None:
    (job.source(KafkaSource(BOOTSTRAP, [IN], bounded=True), parallelism=2).uid("in")
        .key_by(lambda r: r[0])
        .process(Count()).uid("count")
        .sink(ReleasableKafkaSink(BOOTSTRAP, OUT, transactional_id_prefix="rescaled-" + OUT,
                                  delay_per_record_s=SINK_DELAY)).uid("out"))


def broker_down(job: Job) -> None:
    (job.source(KafkaSource("127.0.0.1:9", [IN], bounded=True, connect_timeout_s=2.0))
        .sink(KafkaSink(BOOTSTRAP, OUT, transactional_id_prefix="down-" + OUT)))


def short_transactions(job: Job) -> None:
    (job.source(KafkaSource(BOOTSTRAP, [IN], bounded=True))
        .sink(KafkaSink(BOOTSTRAP, OUT, transactional_id_prefix="short-" + OUT, transaction_timeout_ms=100)))


def sql_totals(job: Job) -> None:
    """Flink SQL over Kafka tables: running counts per sku to an upsert-kafka table, exactly once; the orders'
    metadata columns filter nothing out (one partition, qty = the record's offset)."""
    job.sql(f"""
        CREATE TABLE orders (sku STRING, qty BIGINT, tp STRING METADATA FROM 'topic' VIRTUAL,
          part INT METADATA FROM 'partition' VIRTUAL, `offset` BIGINT METADATA VIRTUAL)
          WITH ('connector' = 'kafka', 'topic' = '{{IN}}-sql',
          'properties.bootstrap.servers' = '{{BOOTSTRAP}}', 'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset', 'format' = 'json');
        CREATE TABLE totals (sku STRING, n BIGINT, qty BIGINT, PRIMARY KEY (sku) NOT ENFORCED)
          WITH ('connector' = 'upsert-kafka', 'topic' = '{{OUT}}-sql', 'properties.bootstrap.servers' = '{{BOOTSTRAP}}',
          'key.format' = 'json', 'value.format' = 'json', 'sink.delivery-guarantee' = 'exactly-once',
          'sink.transactional-id-prefix' = 'sql-{{OUT}}');
        INSERT INTO totals SELECT sku, COUNT(*), SUM(qty) FROM orders
          WHERE tp = '{{IN}}-sql' AND part = 0 AND `offset` = qty GROUP BY sku;
    """)


def sql_parity(job: Job) -> None:
    """sql_totals' upsert-kafka output read back as a changelog (normalized by its key): skus and quantity per
    parity of their count, retracted from one parity as the count moves to the other."""
    job.sql(f"""
        CREATE TABLE totals (sku STRING, n BIGINT, qty BIGINT, PRIMARY KEY (sku) NOT ENFORCED)
          WITH ('connector' = 'upsert-kafka', 'topic' = '{{OUT}}-sql', 'properties.bootstrap.servers' = '{{BOOTSTRAP}}',
          'key.format' = 'json', 'value.format' = 'json', 'scan.bounded.mode' = 'latest-offset');
        CREATE TABLE parity (odd BIGINT, skus BIGINT, qty BIGINT, PRIMARY KEY (odd) NOT ENFORCED)
          WITH ('connector' = 'upsert-kafka', 'topic' = '{{OUT}}-parity',
          'properties.bootstrap.servers' = '{{BOOTSTRAP}}', 'key.format' = 'json', 'value.format' = 'json',
          'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = 'parity-{{OUT}}');
        INSERT INTO parity SELECT odd, COUNT(*), SUM(qty) FROM (SELECT MOD(n, 2) AS odd, qty FROM totals) AS t
          GROUP BY odd;
    """)


def copied(job: Job) -> None:
    """A second job reading the first one's exactly-once output (read_committed, the default), in event time
    from the records' Kafka timestamps with watermarks per partition (3 partitions over 3 subtasks)."""
    (job.source(KafkaSource(BOOTSTRAP, [OUT], bounded=True, deserializer="timestamped"), parallelism=3,
                watermarks=BoundedOutOfOrderness(1000, timestamp=lambda r: r[0]).with_idleness(500))
        .map(lambda r: r[1])
        .sink(KafkaSink(BOOTSTRAP, COPY, delivery="exactly-once", transactional_id_prefix="copied-" + COPY),
              parallelism=1))
'''

WORKER_ARGS = ("--heartbeat-interval", "0.25s")


def graph(http: str, job_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/api/v1/jobs/{job_id}/graph", timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def submit(cluster: Cluster, entry: str, interval_s: float = 0.5, mode: str = "unaligned") -> str:
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
              "checkpoint": {"interval_s": interval_s, "mode": mode, "timeout_s": 10, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}}
    return cluster.submit(f"kafkajobs:{entry}", config)


def assert_exact_counts(out: list[tuple[int, int, Any]], records: list[list[Any]]) -> None:
    counts: dict[str, list[int]] = defaultdict(list)
    for _, _, (key, n) in out:
        counts[key].append(n)
    expected = Counter(k for k, _ in records)
    wrong = {}
    for key, n in expected.items():
        got = Counter(counts[key])
        if sorted(counts[key]) != list(range(1, n + 1)):
            wrong[key] = {"expected": n, "got": len(counts[key]),
                          "duplicated": sorted(c for c, m in got.items() if m > 1)[:10],
                          "missing": sorted(set(range(1, n + 1)) - set(got))[:10]}
    assert set(counts) == set(expected), sorted(set(counts) ^ set(expected))
    assert not wrong, f"{len(wrong)} keys wrong, e.g. {dict(list(wrong.items())[:3])}"
    assert len(out) == len(records)


@pytest.mark.slow
def test_job_kafka_to_kafka_survives_kill_9_exactly_and_feeds_a_second_job(cluster: Cluster,
                                                                          broker: KafkaBroker) -> None:
    """The worker running sink subtask 0 is SIGKILLed once a checkpoint completed (unaligned checkpoints every
    0.5 s). The restart restores the checkpoint: the source resumes at its partitions' offsets, batches whose
    transaction committed are not produced again and the others are. A second job then copies the output
    through the topic, reading only committed records; alongside, SQL over Kafka tables writes an upsert-kafka
table that a third job reads back as a changelog."""
    bs = broker.bootstrap
    topic_in, topic_out, topic_copy = broker.topic("in"), broker.topic("out"), broker.topic("copy")
    topic_bad = broker.topic("bad")
    run(create_topics(bs, {topic_in: PARTITIONS, topic_out: 3, topic_copy: 2, topic_bad: 1, topic_in + "-sql": 2,
                           topic_out + "-sql": 2, topic_out + "-parity": 1}))
    sql_orders = [(f"s{i % 7}", i) for i in range(700)]
    run(produce(bs, topic_in + "-sql", [], partitions=1,
                raw=[json.dumps({"sku": sku, "qty": qty}).encode() for sku, qty in sql_orders]))
    records = input_records(24_000)
    # a malformed record in the middle of every partition, at offset 3000: to the source's side output
    run(produce(bs, topic_in, records[:12_000], partitions=PARTITIONS))
    run(produce(bs, topic_in, [], partitions=PARTITIONS, raw=[b'{"bad %d' % p for p in range(PARTITIONS)]))
    run(produce(bs, topic_in, records[12_000:], partitions=PARTITIONS))
    write_module(cluster.tmp_path, "kafkajobs", JOB.format(bootstrap=bs, topic_in=topic_in, topic_out=topic_out,
                                                           topic_copy=topic_copy, sink_delay=0.0001, release="",
                                                           topic_bad=topic_bad))
    cluster.start(3, worker_args=WORKER_ARGS, worker_ids=True)
    # refused at submit, in one line, before anything runs: a broker that is down, a transaction timeout
    # shorter than the checkpoint interval
    for entry, message in [("broker_down", "cannot connect to Kafka at 127.0.0.1:9"),
                           ("short_transactions", "transaction_timeout_ms=100 is shorter than the checkpoint "
                                                  "interval (0.5s)")]:
        with pytest.raises(RpcError, match=re.escape(message)) as refused:
            submit(cluster, entry)
        assert refused.value.remote_type == "BadConnectorConfig", refused.value
    assert cluster.call("status")["jobs"] == [], "nothing was deployed"
    job_id = submit(cluster, "counted")
    cluster.start_worker(*WORKER_ARGS, worker_id=kill_sink_worker_after_a_checkpoint(cluster, job_id))

    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    out = run(read_topic(bs, topic_out))
    assert_exact_counts(out, records)
    # the kill restarts the job; on a loaded machine a restarted attempt may fail once more (e.g. its first
    # checkpoint times out) and restore again: the output above is exact either way
    assert st["restarts"] >= 1, f"{st}\n{logs(cluster)}"
    assert sorted(v for _, _, v in run(read_topic(bs, topic_bad))) == \
        [[topic_in, p, 3000, f'{{"bad {p}', "JSONDecodeError"] for p in range(PARTITIONS)]
    # the source committed completed checkpoints' offsets to its group (monitoring): within each partition
    committed = run(group_offsets(bs, "counted-" + topic_in))
    assert sorted(committed) == [(topic_in, p) for p in range(PARTITIONS)], committed
    assert all(0 < offset <= len(records) // PARTITIONS + 1 for offset in committed.values()), committed

    copy_id = submit(cluster, "copied", mode="aligned")  # the sources' offsets in aligned checkpoints too
    sql_id = submit(cluster, "sql_totals")  # alongside: Kafka tables in SQL, an updating query to upsert-kafka
    for job in (copy_id, sql_id):
        st = cluster.wait_job(job, 120)
        assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert sorted(tuple(v) for _, _, v in run(read_topic(bs, topic_copy))) == sorted(tuple(v) for _, _, v in out)
    # every key's versions in order (-U dropped, the key's partition keeps them in order): counts 1..n, each once
    versions: dict[str, list[list[int]]] = defaultdict(list)
    for key, value in run(read_topic(bs, topic_out + "-sql", keys=True)):
        versions[json.loads(key)["sku"]].append([value["n"], value["qty"]])
    expected: dict[str, list[list[int]]] = defaultdict(list)
    for sku, qty in sql_orders:
        expected[sku].append([len(expected[sku]) + 1, qty + (expected[sku][-1][1] if expected[sku] else 0)])
    assert dict(versions) == dict(expected)
    # read back as a changelog: every sku ends at an even count, so the odd group was retracted to nothing
    parity_id = submit(cluster, "sql_parity")
    st = cluster.wait_job(parity_id, 120)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    last = {json.loads(key)["odd"]: value for key, value in run(read_topic(bs, topic_out + "-parity", keys=True))}
    assert last == {0: {"odd": 0, "skus": 7, "qty": sum(q for _, q in sql_orders)}, 1: None}


@pytest.mark.slow
def test_rescale_2_3_1_of_a_kafka_fed_job_moves_partitions_exactly(cluster: Cluster, broker: KafkaBroker) -> None:
    """5 partitions read by 2, then 3, then 1 source subtasks while the job runs (`sluice rescale`, from
    unaligned checkpoints): each rescale deals the partitions with their offsets to their new owners and the
    exactly-once sink's pending batches to the new sink subtasks; the output is exact."""
    bs = broker.bootstrap
    topic_in, topic_out = broker.topic("in"), broker.topic("out")
    run(create_topics(bs, {topic_in: 5, topic_out: 2}))
    records = input_records(15_000, seed=11)
    run(produce(bs, topic_in, records, partitions=5))
    release = cluster.tmp_path / "release"
    write_module(cluster.tmp_path, "kafkajobs", JOB.format(bootstrap=bs, topic_in=topic_in, topic_out=topic_out,
                                                           topic_copy="", sink_delay=0.001, release=str(release),
                                                           topic_bad=""))
    cluster.start(2)
    job_id = submit(cluster, "rescaled")
    for parallelism in (3, 1):
        attempt = cluster.call("status", {"job_id": job_id})["attempt"]

        def checkpointed_running(attempt: int = attempt) -> bool:
            st = cluster.call("status", {"job_id": job_id})
            assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{logs(cluster)}"
            return st["state"] == "RUNNING" and st["last_checkpoint"] is not None and st["attempt"] == attempt

        wait_for(checkpointed_running, 60, "a completed checkpoint of the running job")
        proc = sluice(cluster, "rescale", job_id, "--parallelism", str(parallelism))
        assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
        assert f"KafkaSource={parallelism}" in proc.stdout, proc.stdout
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == "RUNNING" and [v["parallelism"] for v in st["vertices"]] == [1, 1], st
    assert len(run(read_topic(bs, topic_out))) < len(records)  # rescaled mid-run: not all of it committed yet
    release.touch()
    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert st["restarts"] == 0, st
    assert_exact_counts(run(read_topic(bs, topic_out)), records)


def with_descendants(pid: int) -> list[int]:
    """`pid` and every process under it (/proc's children lists), parents first."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def kill_9_the_broker_with_nothing_unsaved(cluster: Cluster, broker: KafkaBroker, topic_out: str) -> None:
    """kill -9 the broker, then start it again on its port and data directory, while the job runs.

    A real broker keeps everything it acknowledged through a kill -9 (it is in the OS's page cache) and
    finishes a transaction open across it. noida-db does neither: it writes its state to its data directory
    (kafka.json) about once a second when it changed, a kill -9 losing what it had not written yet; and a
    transaction open across its restart answers the commit with success but commits nothing (tried here with
    aiokafka alone), which no exactly-once protocol survives. So the kill comes at the point where noida-db
    holds nothing unsaved and no transaction is open: the workers (the only clients that write) are frozen
    with SIGSTOP when no transaction holds the output's last stable offset below its end (else thawed and
    tried again), a topic is created after that, and the broker is killed once its file holds that topic.
    The workers go on (SIGCONT) only when the broker is back: their connections are dead, whatever they do
    next goes to a broker that was killed."""
    frozen: list[int] = []
    deadline = time.monotonic() + 60
    while not frozen:
        assert time.monotonic() < deadline, "no moment without an open transaction in 60s"
        pids = [pid for w in cluster.workers if w.proc.poll() is None for pid in with_descendants(w.pid)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        if run(end_offsets(broker.bootstrap, topic_out)) == \
                run(end_offsets(broker.bootstrap, topic_out, isolation_level="read_uncommitted")):
            frozen = pids
        else:
            for pid in reversed(pids):
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    try:
        marker = broker.topic(f"saved-{time.monotonic_ns()}")
        run(create_topics(broker.bootstrap, {marker: 1}))
        state = broker.data_dir / "kafka.json"
        wait_for(lambda: state.exists() and marker in state.read_text(errors="replace"), 30,
                 "noida-db to write its state with the topic created after the freeze")
        broker.kill()
        broker.restart()
    finally:
        for pid in reversed(frozen):
            os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_job_rides_out_a_hung_and_a_killed_broker_mid_run(cluster: Cluster, broker: KafkaBroker) -> None:
    """The broker hangs (SIGSTOP) for three seconds while the job reads and commits, six checkpoint intervals:
    fetches, transactions and offset commits wait or time out and retry. Then it is killed with SIGKILL and
    started again (kill_9_the_broker_with_nothing_unsaved: at the point noida-db allows): connections die, the
    clients reconnect to a broker that was killed, the source fetches again from where it was and the sink's
    next transactions and the group's offsets go to it. The output is exact."""
    if broker.external:
        pytest.skip("SLUICE_KAFKA_BOOTSTRAP names a broker this test cannot pause or kill")
    bs = broker.bootstrap
    topic_in, topic_out = broker.topic("in"), broker.topic("out")
    run(create_topics(bs, {topic_in: PARTITIONS, topic_out: 3}))
    records = input_records(12_000, seed=3)
    run(produce(bs, topic_in, records, partitions=PARTITIONS))
    write_module(cluster.tmp_path, "kafkajobs", JOB.format(bootstrap=bs, topic_in=topic_in, topic_out=topic_out,
                                                           topic_copy="", sink_delay=0.0005, release="",
                                                           topic_bad=""))
    cluster.start(2, worker_args=WORKER_ARGS)
    job_id = submit(cluster, "counted")

    def checkpointed() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{logs(cluster)}"
        return st["last_checkpoint"] is not None

    wait_for(checkpointed, 60, "a completed checkpoint")
    broker.pause()
    try:
        time.sleep(3.0)
    finally:
        broker.resume()
    assert cluster.call("status", {"job_id": job_id})["state"] == "RUNNING"  # it was hung mid-run
    kill_9_the_broker_with_nothing_unsaved(cluster, broker, topic_out)
    assert cluster.call("status", {"job_id": job_id})["state"] == "RUNNING"  # it was killed mid-run
    # the job's REST page shows each source subtask's partitions (exactly those it owns) with their current
    # offset and lag: offset + lag is the broker's end (read_committed), all input having been produced before
    ends = run(end_offsets(bs, topic_in))
    assert ends == {p: len(records) // PARTITIONS for p in range(PARTITIONS)}
    http = cluster.coordinator.fields["http"]
    owners = {s: [p for _, p in kafka_core.assigned([(topic_in, p) for p in range(PARTITIONS)], s, 2)]
              for s in range(2)}
    shown: dict[int, dict[tuple[str, str], float]] = {}

    def source_figures_at_the_broker_end() -> bool:
        shown.clear()
        for sub in graph(http, job_id)["vertices"][0]["subtasks"]:
            shown[sub["subtask"]] = {(f["name"], f["labels"]["partition"]): f["value"] for f in sub["connectors"]}
        for s, figures in shown.items():  # a subtask that reported shows exactly the partitions it owns
            assert not figures or sorted({int(k[1]) for k in figures}) == owners[s], shown
        return all(figures.get(("sluice_kafka_source_current_offset", str(p)), 0)
                   + figures.get(("sluice_kafka_source_lag_records", str(p)), 0) == ends[p]
                   for s, figures in shown.items() for p in owners[s])
    wait_for(source_figures_at_the_broker_end, 30, "the source's offsets and lags on the REST page")
    metrics: dict[str, float] = {}
    for w in cluster.workers:
        metrics.update(scrape(w.fields["metrics"]))
    read = {k: v for k, v in metrics.items() if k.startswith("sluice_kafka_source_records_read_total{")}
    assert sorted(k.split('partition="')[1].split('"')[0] for k in read) == ["0", "1", "2", "3"], read
    assert sum(read.values()) > 0
    assert all(f'topic="{topic_in}"' in k for k in read)
    assert len([k for k in metrics if k.startswith("sluice_kafka_source_lag_records{")]) == PARTITIONS
    assert len([k for k in metrics if k.startswith("sluice_kafka_sink_open_transaction_age_seconds{")]) == 2
    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert_exact_counts(run(read_topic(bs, topic_out)), records)
    # the sink subtask's transactions as its final report shows them: as many as the checkpoints whose markers
    # reached the broker at most (one per checkpoint with records), none left open
    sink = graph(http, job_id)["vertices"][-1]
    for sub in sink["subtasks"]:
        figures = {f["name"]: f["value"] for f in sub["connectors"]}
        marker = run(group_offsets(bs, kafka_core.sink_group("counted-" + topic_out, sub["subtask"])))
        assert 0 < figures["sluice_kafka_sink_transactions_total"] <= max(marker.values()), (figures, marker)
        assert figures["sluice_kafka_sink_open_transaction_age_seconds"] == 0.0
