"""The Kafka connector's pure rules (runtime/connectors/kafka_core.py): partition ownership, start offsets,
source positions dealt on a rescale, and which pre-committed sink batches a recovery produces."""

from __future__ import annotations

import pytest

from runtime.connectors import kafka_core as core


def test_every_partition_has_exactly_one_owner_and_a_topic_is_spread_round_robin() -> None:
    partitions = [("orders", p) for p in range(8)] + [("refunds", p) for p in range(3)]
    for parallelism in (1, 2, 3, 5, 16):
        mine = [core.assigned(partitions, s, parallelism) for s in range(parallelism)]
        assert sorted(tp for m in mine for tp in m) == sorted(partitions)
    counts = [len([p for p in range(8) if core.owner("orders", p, 3) == s]) for s in range(3)]
    assert sorted(counts) == [2, 3, 3]
    # consecutive partitions of a topic go to consecutive subtasks, from a start that depends on the topic
    start = core.owner("orders", 0, 4)
    assert [core.owner("orders", p, 4) for p in range(6)] == [(start + p) % 4 for p in range(6)]
    # stable as partitions are added: an old partition keeps its owner
    assert core.assigned(partitions[:4], 1, 3) == [tp for tp in core.assigned(partitions, 1, 3) if tp[1] < 4
                                                    and tp[0] == "orders"]


def test_start_positions() -> None:
    tps = [("t", 0), ("t", 1)]
    broker = {"earliest": {("t", 0): 5, ("t", 1): 0}, "latest": {("t", 0): 50, ("t", 1): 40},
              "by_time": {("t", 0): 20, ("t", 1): None}, "committed": {("t", 0): 30, ("t", 1): None}}

    def start(spec: object) -> dict[tuple[str, int], int]:
        return core.start_offsets(core.parse_start(spec), tps, **broker)  # type: ignore[arg-type]

    assert start("earliest") == {("t", 0): 5, ("t", 1): 0}
    assert start("latest") == {("t", 0): 50, ("t", 1): 40}
    assert start({"timestamp_ms": 1000}) == {("t", 0): 20, ("t", 1): 40}  # none at/after it: the end
    assert start("committed") == {("t", 0): 30, ("t", 1): 0}  # no committed offset: earliest
    assert start({("t", 1): 7, "t:0": 2}) == {("t", 0): 5, ("t", 1): 7}  # below the earliest live offset: it
    with pytest.raises(ValueError, match="start must be"):
        core.parse_start("newest")


def position(parts: list[list[object]], nxt: list[object] | None = None,
             known: list[list[object]] | None = None) -> dict[str, object]:
    return {"parts": parts, "known": known, "next": nxt}


def test_a_rescale_deals_every_partition_with_its_offset_and_the_emitted_records_to_skip() -> None:
    old = [
        [position([["t", 0, 100, None, 0], ["t", 2, 7, None, 0]], nxt=["t", 2]), 3],  # 3 of t/2's batch emitted
        [position([["t", 1, 40, None, 0], ["t", 3, 0, None, 0]]), 0],
        None,  # a subtask that had finished
    ]
    new = core.redistribute(old, 3)
    every = [["t", p] for p in range(4)]
    assert [s[1] for s in new] == [0, 0, 0]
    assert all(s[0]["known"] == every and s[0]["next"] is None for s in new)
    dealt = {(p[0], p[1]): (subtask, p[2], p[4]) for subtask, s in enumerate(new) for p in s[0]["parts"]}
    assert dealt == {("t", n): (core.owner("t", n, 3), offset, skip)
                     for n, offset, skip in [(0, 100, 0), (1, 40, 0), (2, 7, 3), (3, 0, 0)]}
    # dealt again (3 -> 1): all of it in one subtask, nothing lost, the skip still there
    (single,) = core.redistribute(new, 1)
    assert [p[:5] for p in single[0]["parts"]] == [["t", 0, 100, None, 0], ["t", 1, 40, None, 0],
                                                   ["t", 2, 7, None, 3], ["t", 3, 0, None, 0]]


def test_a_position_naming_a_partition_it_does_not_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="does not hold it"):
        core.fold_emitted(position([["t", 0, 1, None, 0]], nxt=["t", 9]), 2)


def test_recovery_produces_only_the_batches_whose_checkpoint_did_not_reach_the_topic() -> None:
    pending = [[4, 0, "run-a", ["r4"]], [3, 0, "run-a", ["r3"]], [5, 0, "run-a", ["r5"]], [4, 1, "run-a", ["s4"]]]
    # subtask 0's marker says checkpoint 4 committed; subtask 1 never committed
    assert core.batches_to_produce(pending, {0: (4, "run-a"), 1: None}) == [[5, 0, "run-a", ["r5"]],
                                                                           [4, 1, "run-a", ["s4"]]]
    # a marker of another run (an earlier submission reused the names; ids start again at 1): nothing of ours
    assert [e[0] for e in core.batches_to_produce(pending, {0: (9, "run-old"), 1: None})] == [3, 4, 5, 4]
    assert core.batches_to_produce(pending, {0: (5, "run-a"), 1: (4, "run-a")}) == []
    assert core.marker_token(core.marker_metadata("run-a")) == "run-a"
    assert core.marker_token("") is None and core.marker_token("[]") is None


def test_names_are_stable() -> None:
    assert core.transactional_id("orders-job", 3) == "orders-job-3"
    assert core.sink_group("orders-job", 3) == "orders-job-sluice-sink-3"


def test_transaction_timeout_checks() -> None:
    core.check_transaction_timeout(60_000, 900_000, 5.0, topic="out")
    with pytest.raises(core.TransactionTimeoutTooShort, match=r"exceeds the broker's transaction.max.timeout.ms=30000"):
        core.check_transaction_timeout(60_000, 30_000, 5.0, topic="out")
    with pytest.raises(core.TransactionTimeoutTooShort, match=r"shorter than the checkpoint interval \(120s\)"):
        core.check_transaction_timeout(60_000, None, 120.0, topic="out")


def test_lag_and_serde() -> None:
    assert core.lag({("t", 0): 10, ("t", 1): 5}, {("t", 0): 4, ("t", 1): 9, ("t", 2): 0}) == {("t", 0): 6,
                                                                                               ("t", 1): 0}
    record = core.KafkaRecord("t", 0, 7, 1000, b"k", core.encode_json(["a", 1]), ())
    assert core.json_value(record) == ("a", 1)
    assert core.key_value(record) == ("k", ("a", 1))
    packed = core.KafkaRecord("t", 0, 7, 1000, None, core.encode_msgpack(["a", 1]), ())
    assert core.msgpack_value(packed) == ("a", 1)
    assert core.encode_key(12) == b"12" and core.encode_key(None) is None
    with pytest.raises(TypeError, match="raw serializer"):
        core.encode_raw(1)


def test_watermarks_per_partition_take_the_minimum_over_the_partitions_that_are_not_idle() -> None:
    state: dict[str, object] = {"current": ("t", 0), "idle": set()}
    partitions = [("t", 0), ("t", 1)]
    gen = core.PartitionWatermarks(10, 1, None, current=lambda: state["current"], partitions=lambda: partitions,
                                   idle=lambda: state["idle"])
    assert gen.on_timestamp(1000) is None  # t/1 has had no record: it holds the watermark back
    state["current"] = ("t", 1)
    assert gen.on_timestamp(500) == 489  # min(1000, 500) - 10 - 1
    assert gen.on_timestamp(400) is None  # late within t/1: nothing new
    state["current"] = ("t", 0)
    assert gen.on_timestamp(5000) is None  # t/0 far ahead does not advance it: t/1 is at 500
    state["idle"] = {("t", 1)}
    assert gen.on_timestamp(5001) == 4990  # t/1 idle: only t/0 counts
    state["idle"] = set()
    state["current"] = ("t", 1)
    assert gen.on_timestamp(600) is None  # t/1 active again: the watermark never goes back
    snap = gen.snapshot()
    assert snap == [5001, 4990, False, {"t:0": 5001, "t:1": 600}]
    restored: dict[str, object] = {"current": ("t", 1)}
    again = core.PartitionWatermarks(10, 1, snap, current=lambda: restored["current"],
                                     partitions=lambda: partitions, idle=lambda: set())
    assert again.on_timestamp(6000) is None  # t/0's restored maximum, 5001, still holds it at 4990
    restored["current"] = ("t", 0)
    assert again.on_timestamp(5100) == 5089


def test_a_batch_is_decoded_up_to_its_first_malformed_record_which_then_leads_a_batch_of_its_own() -> None:
    def record(offset: int, value: bytes) -> core.KafkaRecord:
        return core.KafkaRecord("orders", 3, offset, 1000 + offset, b"k", value, (("h", b"1"),))

    raw = [record(10, b'["a",1]'), record(11, b'{"not json'), record(12, b'["b",2]')]
    values, bad = core.decode_prefix(raw, core.json_value)
    assert values == [("a", 1)]
    assert bad is not None and bad[0] is raw[1] and type(bad[1]).__name__ == "JSONDecodeError"
    values, bad = core.decode_prefix(raw[1:], core.json_value)  # the malformed one leads: nothing before it
    assert values == [] and bad is not None and bad[0] is raw[1]
    assert core.decode_prefix(raw[2:], core.json_value) == ([("b", 2)], None)
    assert core.decode_prefix([], core.json_value) == ([], None)
    malformed = core.MalformedKafkaRecord.of(raw[1], ValueError("Unterminated string"))
    assert malformed == core.MalformedKafkaRecord("orders", 3, 11, 1011, b"k", b'{"not json', (("h", b"1"),),
                                                  "ValueError: Unterminated string")
