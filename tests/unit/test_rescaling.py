"""Restoring at another parallelism (runtime/checkpointing/rescaling.py): any old parallelism to any new one,
every record, key and split accounted for exactly once, order per (upstream subtask, key) kept, and every
key's state on the subtask the runtime routes that key to."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.api import Job, OperatorContext, ProcessFunction
from runtime.checkpointing.rescaling import (
    RescaleError,
    merge_keyed,
    overlapping_subtasks,
    redistribute_broadcast,
    redistribute_edge,
    replica_of,
    rescale_lists,
    rescale_sinks,
    rescale_source,
)
from runtime.checkpointing.snapshots import decode_operator_state, encode_operator_state, keyed_tables, list_tables
from runtime.connectors.files import JsonLinesSource
from runtime.connectors.generator import BLOCK, GeneratorSource
from runtime.connectors.sinks import DiscardSink
from runtime.connectors.source import Source
from runtime.connectors.splits import SplitReader, deal_splits, fold_emitted, is_split_position
from runtime.examples.wordcount import Count
from runtime.execution.operators import Chain
from runtime.graph.partitioning import KeyRouter, key_group_range

parallelisms = st.integers(min_value=1, max_value=9)
max_parallelisms = st.sampled_from([9, 16, 128])


def pack(record: Any) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def unpack_all(stream: bytes) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False, strict_map_key=False)
    unpacker.feed(stream)
    return list(unpacker)


@given(max_parallelisms, parallelisms)
def test_key_group_ranges_are_what_the_router_uses(max_p: int, p: int) -> None:
    p = min(p, max_p)
    seen = []
    for i in range(p):
        for g in key_group_range(max_p, p, i):
            assert g * p // max_p == i
            seen.append(g)
    assert seen == list(range(max_p))


@settings(max_examples=60, deadline=None)
@given(max_parallelisms, parallelisms, parallelisms,
       st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-(2**40), 2**40),
                                 st.tuples(st.text(max_size=3), st.integers(0, 99))),
                       st.integers(-(2**40), 2**40), max_size=60))
def test_keyed_state_lands_where_the_router_sends_its_key(max_p: int, old_p: int, new_p: int,
                                                          table: dict[Any, int]) -> None:
    old_p, new_p = min(old_p, max_p), min(new_p, max_p)
    old_router, new_router = KeyRouter(max_p, old_p), KeyRouter(max_p, new_p)
    old_tables: list[dict[Any, int]] = [{} for _ in range(old_p)]
    for key, value in table.items():
        old_tables[old_router.route(key)][key] = value
    files = [decode_operator_state(encode_operator_state({3: {"count": t}}, max_parallelism=max_p, source=None,
                                                         sinks=[]), "test") for t in old_tables]
    landed: dict[Any, list[int]] = {}
    for i in range(new_p):
        groups = key_group_range(max_p, new_p, i)
        merged = merge_keyed([keyed_tables(files[j], key_groups=groups)
                              for j in overlapping_subtasks(max_p, old_p, groups)])
        for key, value in merged.get(3, {}).get("count", {}).items():
            assert value == table[key]
            landed.setdefault(key, []).append(i)
    assert set(landed) == set(table)
    for key, subtasks in landed.items():
        assert subtasks == [new_router.route(key)], (key, subtasks)


@st.composite
def channel_states(draw: Any, partitioner: str) -> tuple[int, int, dict[tuple[int, int], bytes], list[Any]]:
    """Old producers emit (key, producer, seq) in order; each old channel's records are cut at a random point
    into what the consumer had received (input channel state) and what was still queued (output state);
    a prefix of each channel was processed before the checkpoint and is not in the state at all."""
    max_p = draw(max_parallelisms)
    old_up, old_down = draw(parallelisms), draw(parallelisms)
    if partitioner == "forward":
        old_down = old_up
    keys = draw(st.lists(st.text(max_size=4), min_size=1, max_size=8, unique=True))
    router = KeyRouter(max_p, old_down)
    streams: dict[tuple[int, int], bytes] = {}
    records: list[Any] = []
    for j in range(old_up):
        sent: dict[int, list[Any]] = {}
        n = draw(st.integers(min_value=0, max_value=30))
        for seq in range(n):
            key = draw(st.sampled_from(keys))
            k = router.route(key) if partitioner == "hash" else j if partitioner == "forward" else (j + seq) % old_down
            sent.setdefault(k, []).append((key, j, seq, k))
        for k, chan in sent.items():
            processed = draw(st.integers(min_value=0, max_value=len(chan)))
            cut = draw(st.integers(min_value=processed, max_value=len(chan)))
            inputs = b"".join(pack(r) for r in chan[processed:cut])
            outputs = b"".join(pack(r) for r in chan[cut:])
            streams[(j, k)] = inputs + outputs  # the two files of one old channel, in order
            records += chan[processed:]
    return max_p, old_up, streams, records


def check_redistribution(partitioner: str, max_p: int, streams: dict[tuple[int, int], bytes], records: list[Any],
                         new_up: int, new_down: int) -> dict[int, dict[int, list[Any]]]:
    got: dict[int, dict[int, list[Any]]] = {}
    for i in range(new_down):
        share = redistribute_edge(partitioner, streams, consumer=i, new_up=new_up, new_down=new_down,
                                  max_parallelism=max_p, key_fn=lambda r: r[0])
        for channel, stream in share.items():
            assert 0 <= channel < new_up
            got.setdefault(i, {})[channel] = unpack_all(stream)
    every = [r for by_channel in got.values() for recs in by_channel.values() for r in recs]
    assert Counter(every) == Counter(records)  # every record exactly once
    for by_channel in got.values():
        for channel, recs in by_channel.items():
            assert all(r[1] % new_up == channel for r in recs)  # old producer j -> new channel j mod q_up
            # order per old channel; on hash and forward edges one key of one upstream subtask has only one
            # channel, so this is the order per (upstream, key); on rebalance there was none beyond a channel
            per_channel: dict[tuple[Any, ...], list[int]] = {}
            for key, j, seq, k in recs:
                per_channel.setdefault((j, k) if partitioner == "rebalance" else (key, j), []).append(seq)
            assert all(seqs == sorted(seqs) for seqs in per_channel.values())
    return got


@settings(max_examples=150, deadline=None)
@given(channel_states("hash"), parallelisms, parallelisms)
def test_hash_channel_state_goes_to_the_owner_of_each_key_in_order(state: Any, new_up: int, new_down: int) -> None:
    max_p, _, streams, records = state
    new_down = min(new_down, max_p)
    got = check_redistribution("hash", max_p, streams, records, new_up, new_down)
    router = KeyRouter(max_p, new_down)
    for i, by_channel in got.items():
        assert all(router.route(r[0]) == i for recs in by_channel.values() for r in recs)


@settings(max_examples=100, deadline=None)
@given(channel_states("rebalance"), parallelisms, parallelisms)
def test_rebalance_channel_state_is_spread_exactly_once(state: Any, new_up: int, new_down: int) -> None:
    max_p, _, streams, records = state
    check_redistribution("rebalance", max_p, streams, records, new_up, new_down)


@settings(max_examples=100, deadline=None)
@given(channel_states("forward"), parallelisms)
def test_forward_channel_state_stays_on_pairs(state: Any, new_p: int) -> None:
    max_p, _, streams, records = state
    got = check_redistribution("forward", max_p, streams, records, new_p, new_p)
    assert all(set(by_channel) == {i} for i, by_channel in got.items())


def test_broadcast_channel_state_is_not_split_record_by_record() -> None:
    with pytest.raises(RescaleError, match="broadcast"):
        redistribute_edge("broadcast", {(0, 0): pack(1)}, consumer=0, new_up=2, new_down=2, max_parallelism=128)


# -- broadcast edges: every new consumer continues one old consumer, state and channel state together --------


@st.composite
def broadcast_checkpoints(draw: Any) -> tuple[int, int, list[list[Any]], list[Any], dict[tuple[int, int], bytes]]:
    """Old producer j sends P_j = [j, 0], [j, 1], ... to every old consumer; each consumer k had processed its
    own prefix of each P_j (unaligned: the prefixes differ) and keeps what it processed in list state; the rest
    of each channel before the barrier is cut at a random point into input and output channel state."""
    old_up, old_down = draw(parallelisms), draw(parallelisms)
    produced = [[[j, n] for n in range(draw(st.integers(min_value=0, max_value=12)))] for j in range(old_up)]
    lists: list[Any] = []
    streams: dict[tuple[int, int], bytes] = {}
    for k in range(old_down):
        seen: list[Any] = []
        for j, records in enumerate(produced):
            processed = draw(st.integers(min_value=0, max_value=len(records)))
            cut = draw(st.integers(min_value=processed, max_value=len(records)))
            seen += records[:processed]
            streams[(j, k)] = (b"".join(pack(r) for r in records[processed:cut])
                               + b"".join(pack(r) for r in records[cut:]))
        lists.append({5: {"seen": ["split", seen]}} if seen else None)
    return old_up, old_down, produced, lists, streams


@settings(max_examples=150, deadline=None)
@given(broadcast_checkpoints(), parallelisms, parallelisms)
def test_broadcast_every_new_consumer_sees_every_record_of_every_producer_once(
        checkpoint: Any, new_up: int, new_down: int) -> None:
    old_up, old_down, produced, lists, streams = checkpoint
    for c in range(new_down):
        state = rescale_lists(lists, new_down, c, replicated=True)
        seen = state.get(5, {}).get("seen", ["split", []])[1]
        share = redistribute_broadcast(streams, consumer=c, old_down=old_down, new_up=new_up)
        replayed: dict[int, list[Any]] = {}
        for channel, stream in share.items():
            assert 0 <= channel < new_up
            for j, n in unpack_all(stream):
                assert j % new_up == channel  # old producer j -> new channel j mod q_up
                replayed.setdefault(j, []).append([j, n])
        for j in range(old_up):
            # what its state reflects, then what it replays: exactly P_j, in order, nothing twice
            assert [r for r in seen if r[0] == j] + replayed.get(j, []) == produced[j], (c, j)


def test_broadcast_replicas_scale_down_keeps_the_first_and_scale_up_clones_round_robin() -> None:
    assert [replica_of(c, 3) for c in range(2)] == [0, 1]
    assert [replica_of(c, 2) for c in range(5)] == [0, 1, 0, 1, 0]
    streams = {(0, 0): pack("a"), (0, 1): pack("b"), (1, 0): pack("c"), (1, 1): b""}
    assert redistribute_broadcast(streams, consumer=3, old_down=2, new_up=1) == {0: pack("b")}
    assert redistribute_broadcast(streams, consumer=2, old_down=2, new_up=2) == {0: pack("a"), 1: pack("c")}


# -- list state ----------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 10**6), max_size=12)), min_size=1, max_size=9),
       parallelisms)
def test_split_list_state_lands_exactly_once_and_union_everywhere(old: list[list[int] | None], new_p: int) -> None:
    tagged = [None if items is None else [[j, i] for i in items] for j, items in enumerate(old)]
    lists = [None if items is None else {2: {"buf": ["split", items], "all": ["union", items]}} for items in tagged]
    everything = [item for items in tagged if items for item in items]
    split: list[Any] = []
    sizes = []
    for i in range(new_p):
        mine = rescale_lists(lists, new_p, i)
        buf = mine.get(2, {}).get("buf", ["split", []])
        assert buf[0] == "split"
        split += buf[1]
        sizes.append(len(buf[1]))
        assert all(a[0] <= b[0] for a, b in zip(buf[1], buf[1][1:], strict=False))  # old subtask order kept
        assert mine.get(2, {}).get("all", ["union", []]) == ["union", everything]
    assert sorted(split) == sorted(everything)  # each item in exactly one new subtask
    assert max(sizes) - min(sizes) <= 1  # round robin: as even as it gets


def test_list_state_mode_must_agree_across_subtasks() -> None:
    with pytest.raises(RescaleError, match="'buf'"):
        rescale_lists([{1: {"buf": ["split", [1]]}}, {1: {"buf": ["union", [2]]}}], 3, 0)


def test_list_state_survives_snapshot_and_restore_in_a_chain() -> None:
    job = Job("lists")
    job.source(GeneratorSource(count=1, keys=1), parallelism=1).process(Buffer(), parallelism=1)
    chain = Chain(job, [0, 1], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    for record in ("a", "b", "c"):
        chain.process(record)
    snapshot = chain.snapshot_lists()
    assert snapshot == {1: {"buf": ["split", ["a", "b", "c"]], "seen": ["union", [3]]}}
    chain.process("d")
    assert snapshot[1]["buf"][1] == ["a", "b", "c"]  # a copy: later records do not change it
    state = decode_operator_state(encode_operator_state({}, max_parallelism=128, source=None, sinks=[],
                                                        lists=snapshot), "test")
    again = Chain(job, [0, 1], subtask_index=0, parallelism=1, attempt=1, outputs=[])
    again.restore_lists(list_tables(state))
    again.open()
    again.process("e")
    assert again.snapshot_lists() == {1: {"buf": ["split", ["a", "b", "c", "e"]], "seen": ["union", [4]]}}
    assert list_tables(decode_operator_state(encode_operator_state({}, max_parallelism=128, source=None,
                                                                   sinks=[]), "test")) == {}


class Buffer(ProcessFunction):
    def open(self, ctx: Any) -> None:
        self.buf = ctx.list_state("buf")
        self.seen = ctx.union_list_state("seen")

    def process(self, record: Any, ctx: Any) -> None:
        self.buf.add(record)
        count = self.seen.get()
        self.seen.update([(count[0] if count else 0) + 1])


def test_a_list_state_name_has_one_mode() -> None:
    ctx = OperatorContext(lambda r: None, 0, 1, "op", {})
    ctx.list_state("x").add(1)
    assert ctx.operator_list_state("x").get() == [1]
    with pytest.raises(ValueError, match="'x' of op is a split list"):
        ctx.union_list_state("x")


# -- sources: every record read exactly once across any number of rescales ------------------------------------


def read_some(source: Any, batches: int, batch: int) -> tuple[list[Any], Any]:
    """Read `batches` batches; stop in the middle of the last like a checkpoint between records would:
    returns what was emitted and the state the task stores ([position before the batch, emitted of it])."""
    out: list[Any] = []
    state: Any = [source.position(), 0]
    for _ in range(batches):
        position = source.position()
        got = source.read_batch(batch)
        if got is None:
            return out, [position, 0]
        half = len(got) // 2
        out += got[:half]
        state = [position, half]
        out += got[half:]
        state = [source.position(), 0]
    return out, state


def restored(state: Any, subtask: int, parallelism: int, count: int) -> GeneratorSource:
    source = GeneratorSource(count=count, keys=50, seed=1)
    source.open(subtask, parallelism)
    position, emitted = state
    if position is not None:
        source.restore(position)
        skip = emitted
        while skip > 0:
            skipped = source.read_batch(skip)
            if not skipped:
                break
            skip -= len(skipped)
    return source


@settings(max_examples=40, deadline=None)
@given(st.lists(parallelisms, min_size=2, max_size=4), st.integers(min_value=0, max_value=6 * BLOCK),
       st.data())
def test_generator_reads_every_record_once_across_rescales(ps: list[int], count: int, data: Any) -> None:
    emitted: list[Any] = []
    states: list[Any] = [[None, 0]] * ps[0]
    for step, p in enumerate(ps):
        if step:
            states = rescale_source(states, p)
        sources = [restored(states[i], i, p, count) for i in range(p)]
        last = step == len(ps) - 1
        states = []
        for source in sources:
            batches = 10**6 if last else data.draw(st.integers(min_value=0, max_value=4))
            got, state = read_some(source, batches, data.draw(st.integers(min_value=1, max_value=700)))
            emitted += got
            states.append(state)
    assert sorted(r[1] for r in emitted) == list(range(count))


def test_sink_pending_files_are_each_committed_by_one_new_subtask() -> None:
    for old_p in range(1, 6):
        for new_p in range(1, 6):
            old = [[{"pending": [[5, f"h{j}-{n}", f"f{j}-{n}"] for n in range(2)], "checkpoint": 5}, None]
                   for j in range(old_p)]
            new = [rescale_sinks(old, new_p, i, 5) for i in range(new_p)]
            finals = [e[2] for states in new for e in states[0]["pending"]]
            assert sorted(finals) == sorted(f"f{j}-{n}" for j in range(old_p) for n in range(2))
            cleaned = [j for states in new for j in states[0]["subtasks"]]
            assert sorted(cleaned) == list(range(old_p))
            assert all(states[1] is None and states[0]["checkpoint"] == 5 for states in new)


@pytest.fixture(scope="module")
def json_input(tmp_path_factory: Any) -> tuple[str, list[Any]]:
    """Seven JSON lines files of different lengths, with blank lines (not records, but lines) in them."""
    directory = tmp_path_factory.mktemp("jsonl")
    records = []
    for f in range(7):
        lines = []
        for n in range(f * 13 % 40):
            records.append([f, n])
            lines.append(json.dumps([f, n]))
            if n % 5 == 0:
                lines.append("")
        (directory / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return str(directory), [tuple(r) for r in records]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(parallelisms, min_size=2, max_size=4), st.data())
def test_json_lines_files_are_read_once_across_rescales(json_input: Any, ps: list[int], data: Any) -> None:
    path, records = json_input
    emitted: list[Any] = []
    states: list[Any] = [[None, 0]] * ps[0]
    for step, p in enumerate(ps):
        if step:
            states = rescale_source(states, p, JsonLinesSource(path).lanes)
        last = step == len(ps) - 1
        new_states = []
        for i in range(p):
            source = JsonLinesSource(path)
            source.open(i, p)
            position, skip = states[i]
            if position is not None:
                source.restore(position)
                while skip > 0:
                    skipped = source.read_batch(skip)
                    if not skipped:
                        break
                    skip -= len(skipped)
            batches = 10**6 if last else data.draw(st.integers(min_value=0, max_value=4))
            got, state = read_some(source, batches, data.draw(st.integers(min_value=1, max_value=30)))
            emitted += got
            new_states.append(state)
        states = new_states
    assert Counter(emitted) == Counter(records)


# -- --parallelism -------------------------------------------------------------------------------------------


def small_job(job: Any) -> None:
    (job.source(GeneratorSource(count=10), parallelism=2).key_by(lambda r: r[0]).process(Count(), parallelism=2)
        .sink(DiscardSink()))


def test_parallelism_overrides_every_operator_or_one_by_name() -> None:
    from runtime.api import Job
    from runtime.graph.plan import apply_parallelism, chain_graph

    job = Job("t")
    small_job(job)
    apply_parallelism(job, {"*": 3, "GeneratorSource": 1})
    vertices, edges = chain_graph(job)
    assert [(v.name, v.parallelism) for v in vertices] == [("GeneratorSource", 1), ("Count -> DiscardSink", 3)]
    assert edges[0].partitioner == "hash"


def test_parallelism_override_errors_are_one_line() -> None:
    from runtime.api import Job, JobDefinitionError
    from runtime.cli.main import _parallelism
    from runtime.graph.plan import apply_parallelism

    for overrides, words in (({"Nope": 2}, ["Nope", "Count"]), ({"*": 0}, ["1..128"]),
                             ({"Count": 3}, [])):
        job = Job("t")
        small_job(job)
        if not words:  # Count at 3, its chained sink still at 2: a rebalance between them, not an error
            apply_parallelism(job, overrides)
            continue
        with pytest.raises(JobDefinitionError) as err:
            apply_parallelism(job, overrides)
        assert all(w in str(err.value) for w in words) and "\n" not in str(err.value), err.value
    assert _parallelism("4") == ("*", 4) and _parallelism("Count=2") == ("Count", 2)
    for bad in ("0", "x", "=3", "Count=", "Count=-1"):
        with pytest.raises(Exception) as caught:
            _parallelism(bad)
        assert bad in str(caught.value)


# -- what the coordinator refuses before it stops anything (runtime/graph/rescalability.py) ---------------------


def plan_of(build: Any, overrides: dict[str, int] | None = None) -> tuple[Any, Any, Any]:
    from runtime.api import Job
    from runtime.graph.plan import apply_parallelism, chain_graph

    job = Job("t")
    build(job)
    if overrides:
        apply_parallelism(job, overrides)
    vertices, edges = chain_graph(job)
    return job, vertices, edges


def counted(job: Any) -> None:
    (job.source(GeneratorSource(count=10), parallelism=2).key_by(lambda r: r[0]).process(Count(), parallelism=2)
        .sink(DiscardSink()))


def test_a_chain_split_by_a_rescale_is_matched_by_node_and_a_merge_is_refused() -> None:
    from runtime.graph.rescalability import NotRestorable, checkpointed_node_parallelism

    job, before, _ = plan_of(counted)
    saved = [{"name": v.name, "parallelism": v.parallelism} for v in before]
    assert [v.name for v in before] == ["GeneratorSource", "Count -> DiscardSink"]
    assert checkpointed_node_parallelism(saved, job, before) == {0: 2, 1: 2, 2: 2}
    job, split, _ = plan_of(counted, {"Count": 3})
    assert [v.name for v in split] == ["GeneratorSource", "Count", "DiscardSink"]
    assert checkpointed_node_parallelism(saved, job, split) == {0: 2, 1: 2, 2: 2}  # Count and its sink were at 2
    # the other way round: two tasks that a rescale would chain into one
    unchained = [{"name": v.name, "parallelism": v.parallelism} for v in split]
    job, _, _ = plan_of(counted)
    with pytest.raises(NotRestorable, match=r"^Count and DiscardSink ran as two tasks \(parallelism 3 and 2\)"):
        checkpointed_node_parallelism(unchained, job, before)
    with pytest.raises(NotRestorable, match="^was taken from a different job graph"):
        checkpointed_node_parallelism([{"name": "Other", "parallelism": 1}], job, before)


def broadcast_and_main(job: Any) -> None:
    rules = job.source(GeneratorSource(count=10), parallelism=1, name="rules")
    main = job.source(GeneratorSource(count=10), parallelism=2, name="main")
    rules.broadcast().union(main.rebalance()).process(Buffer(), parallelism=2).sink(DiscardSink())


def test_refusals_name_the_source_without_lanes_and_the_mixed_broadcast_function() -> None:
    from runtime.connectors.source import Source
    from runtime.graph.rescalability import rescale_refusal

    class Numbers(Source):
        bounded = False

    job, vertices, edges = plan_of(lambda j: j.source(Numbers(), parallelism=2).sink(DiscardSink()), {"*": 3})
    message = rescale_refusal(job, vertices, edges, {0: 2, 1: 2})
    assert message is not None and message.startswith("source Numbers (Numbers) cannot be restored at parallelism 3")
    assert rescale_refusal(job, vertices, edges, {0: 3, 1: 3}) is None  # at its own parallelism it restores

    job, vertices, edges = plan_of(broadcast_and_main, {"Buffer": 3, "DiscardSink": 3})
    old = {n.id: 1 if n.name == "rules" else 2 for n in job.nodes}
    message = rescale_refusal(job, vertices, edges, old)
    assert message is not None and message.startswith("Buffer reads a broadcast input and another one"), message
    # a plain broadcast consumer rescales (replicated), its producer too
    job, vertices, edges = plan_of(lambda j: j.source(GeneratorSource(count=10), parallelism=2).broadcast()
                                   .process(Buffer(), parallelism=3).sink(DiscardSink()), {"*": 3})
    assert rescale_refusal(job, vertices, edges, {0: 2, 1: 2, 2: 2}) is None


# -- sources whose subtasks read independent inputs: old subtasks move whole, as splits -------------------------


class Numbers(Source):
    """Subtask i of p emits [i, p, 0], [i, p, 1], ... up to its own limit; its position is a bare number."""

    subtask_splits = True

    def __init__(self, bounded: bool = True) -> None:
        self.bounded = bounded

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.n = 0
        self.limit = 5 + 37 * subtask_index

    def read_batch(self, max_records: int) -> list[Any] | None:
        if self.n >= self.limit:
            return None if self.bounded else []
        out = [[self.subtask_index, self.parallelism, n] for n in range(self.n, min(self.limit, self.n + max_records))]
        self.n += len(out)
        return out

    def position(self) -> int:
        return self.n

    def restore(self, position: Any) -> None:
        self.n = int(position)


def read_cut(source: Source, batches: int, batch: int, to_the_end: bool) -> tuple[list[Any], Any]:
    """Read `batches` batches, the checkpoint falling in the middle of the last one (half of it emitted):
    returns what was emitted and the state the task stores ([position before the batch, emitted of it])."""
    out: list[Any] = []
    state: Any = [source.position(), 0]
    for n in range(batches):
        position = source.position()
        got = source.read_batch(batch)
        if got is None:
            return out, [position, 0]
        if n == batches - 1 and not to_the_end:
            out += got[:len(got) // 2]
            return out, [position, len(got) // 2]
        out += got
        state = [source.position(), 0]
    return out, state


def started(state: Any, subtask: int, parallelism: int) -> Source:
    """What the task does on a restore: the split reader or the source itself, opened, restored, skipping."""
    source: Source = SplitReader(Numbers()) if is_split_position(state[0]) else Numbers()
    source.open(subtask, parallelism)
    position, emitted = state
    if position is not None:
        source.restore(position)
        skip = emitted
        while skip > 0:
            skipped = source.read_batch(skip)
            assert skipped, "a restored source reads what it had emitted again"
            skip -= len(skipped)
    return source


@settings(max_examples=100, deadline=None)
@given(st.lists(parallelisms, min_size=2, max_size=5), st.data())
def test_subtask_splits_are_each_read_once_across_rescales(ps: list[int], data: Any) -> None:
    emitted: list[Any] = []
    states: list[Any] = [[None, 0]] * ps[0]
    first = [(i, ps[0], n) for i in range(ps[0]) for n in range(5 + 37 * i)]
    for step, p in enumerate(ps):
        if step and p != ps[step - 1]:
            states = deal_splits(states, p)
        elif step:  # the same parallelism: each its own state; a split reader skips split by split
            states = [[fold_emitted(s[0], s[1]), 0] if is_split_position(s[0]) else s for s in states]
        sources = [started(states[i], i, p) for i in range(p)]
        last = step == len(ps) - 1
        states = []
        for source in sources:
            batches = 10**6 if last else data.draw(st.integers(min_value=0, max_value=4))
            got, state = read_cut(source, batches, data.draw(st.integers(min_value=1, max_value=30)), last)
            emitted += got
            states.append(state)
    assert sorted(tuple(r) for r in emitted) == first  # every record of every split, once


def test_a_subtask_without_splits_waits_when_unbounded_and_ends_when_bounded() -> None:
    dealt = deal_splits([[3, 0]], 2)
    assert dealt == [[{"splits": [[0, 1, 3, 0]], "next": 0}, 0], [{"splits": [], "next": 0}, 0]]
    for bounded, expected in ((True, None), (False, [])):
        reader = SplitReader(Numbers(bounded))
        reader.open(1, 2)
        reader.restore(dealt[1][0])
        assert reader.read_batch(10) == expected


def test_the_old_plan_of_a_split_chain_maps_tasks_and_edges_by_operator() -> None:
    from runtime.graph.job_config import JobConfig
    from runtime.graph.plan import Plan
    from runtime.graph.restore_spec import RestoreSpec
    from runtime.worker.restoring import OldPlan

    job, vertices, edges = plan_of(counted, {"Count": 3})
    plan = Plan(job_id="j", attempt=0, entry="", name="t", sys_path="", channel_base=0, vertices=vertices,
                edges=edges, placement={}, workers={}, config=JobConfig())
    then = OldPlan(RestoreSpec(path="", checkpoint_id=1, nodes={0: 2, 1: 2, 2: 2}), plan, job)
    assert [(v.name, v.parallelism) for v in then.vertices] == [("GeneratorSource", 2), ("Count -> DiscardSink", 2)]
    source, count, sink = vertices
    assert then.vertex(count) is then.vertex(sink) is then.vertices[1]
    assert then.same_vertex(source) and not then.same_vertex(count) and not then.same_vertex(sink)
    into_count, into_sink = edges
    assert then.edge(into_count) is then.edges[0]  # source -> Count continues the old hash edge
    assert then.edge(into_sink) is None  # Count -> DiscardSink was inside the chain: nothing in flight
    assert not then.same_edge(into_count)
