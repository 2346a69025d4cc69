"""Incremental channel state (runtime/checkpointing/channel_segments.py) and segment retention
(runtime/common/retention.py): random histories of captures, completions, late notifications, aborts and
retention against a model store."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from netstack.credit import Buffer
from runtime.checkpointing.channel_files import input_capture, output_capture, whole_records_end
from runtime.checkpointing.channel_segments import (
    ChannelCapture,
    Ref,
    SegmentTracker,
    pieces_length,
    resolve,
    segments_of,
    truncate,
)
from runtime.common.retention import segment_writer, unneeded_segments
from runtime.execution.channels import overtaken_records, whole_records


def test_second_capture_references_the_first_and_writes_only_new_buffers() -> None:
    t = SegmentTracker("v-0")
    t.begin(1, savepoint=False)
    c1 = t.capture(1, "out", {"e": ChannelCapture(b"", [("a", b"aaaa"), ("b", b"bb")])})
    assert c1.new_parts == [b"aaaa", b"bb"] and c1.pieces["e"] == [Ref(c1.segment or "", 0, 6)]
    t.completed(1)
    t.begin(2, savepoint=False)
    c2 = t.capture(2, "out", {"e": ChannelCapture(b"h", [("b", b"bb"), ("c", b"ccc")])})
    assert c2.new_parts == [b"ccc"]
    assert c2.pieces["e"] == [b"h", Ref(c1.segment or "", 4, 2), Ref(c2.segment or "", 0, 3)]
    store = {c1.segment: b"aaaabb", c2.segment: b"ccc"}
    assert resolve(c2.pieces["e"], store) == b"hbbccc"


def test_no_reference_to_a_completed_checkpoint_when_a_newer_one_began_first() -> None:
    t = SegmentTracker("v-0")
    t.begin(1, savepoint=False)
    t.capture(1, "in", {"e": ChannelCapture(b"", [("a", b"aa")])})
    t.begin(2, savepoint=False)  # began before the task heard that 1 completed
    t.completed(1)
    t.begin(3, savepoint=False)
    assert t.capture(3, "in", {"e": ChannelCapture(b"", [("a", b"aa")])}).new_parts == [b"aa"]


def test_savepoints_are_inline_and_never_a_base() -> None:
    t = SegmentTracker("v-0")
    t.begin(1, savepoint=True)
    c = t.capture(1, "out", {"e": ChannelCapture(b"", [("a", b"aa")])})
    assert c.segment is None and c.pieces["e"] == [b"aa"]
    t.completed(1)
    t.begin(2, savepoint=False)
    assert t.capture(2, "out", {"e": ChannelCapture(b"", [("a", b"aa")])}).new_parts == [b"aa"]


def test_a_full_checkpoint_references_nothing_of_its_base_and_becomes_the_next_base() -> None:
    t = SegmentTracker("v-0")
    t.begin(1, savepoint=False)
    c1 = t.capture(1, "out", {"e": ChannelCapture(b"", [("a", b"aa")])})
    t.completed(1)
    t.begin(2, savepoint=False, full=True)  # storage lost files: c1's segment may be gone
    c2 = t.capture(2, "out", {"e": ChannelCapture(b"", [("a", b"aa"), ("b", b"b")])})
    assert c2.new_parts == [b"aa", b"b"] and segments_of(c2.pieces) == {c2.segment}
    t.completed(2)
    t.begin(3, savepoint=False)
    c3 = t.capture(3, "out", {"e": ChannelCapture(b"", [("b", b"b")])})
    assert c3.new_parts == [] and c3.pieces["e"] == [Ref(c2.segment or "", 2, 1)] and c1.segment != c2.segment


def test_disabled_writes_everything_inline() -> None:
    t = SegmentTracker("v-0", incremental=False)
    t.begin(1, savepoint=False)
    assert t.capture(1, "out", {"e": ChannelCapture(b"x", [("a", b"aa")], 1)}).pieces["e"] == [b"x", b"a"]


def test_segment_names_and_sweeping() -> None:
    assert segment_writer("chan-12-3-0-ab12cd34-in.seg") == 12
    assert segment_writer("0123abcd.sst") is None
    names = ["chan-1-a-in.seg", "chan-2-a-in.seg", "chan-3-a-in.seg", "x.sst"]
    assert unneeded_segments(names, {"chan-1-a-in.seg"}, 2, {3}) == {"chan-2-a-in.seg"}
    assert unneeded_segments(names, set(), 3, {1}) == {"chan-2-a-in.seg", "chan-3-a-in.seg"}  # 1 in progress


@given(st.lists(st.binary(min_size=1, max_size=6), max_size=6), st.binary(max_size=4), st.data())
def test_truncate_is_a_prefix(parts: list[bytes], head: bytes, data: st.DataObject) -> None:
    t = SegmentTracker("v")
    t.begin(1, savepoint=False)
    c = t.capture(1, "in", {"e": ChannelCapture(head, list(enumerate(parts)))})
    store = {c.segment: b"".join(c.new_parts)}
    whole = resolve(c.pieces["e"], store)
    assert whole == head + b"".join(parts)
    n = data.draw(st.integers(0, len(whole)))
    cut = truncate(c.pieces["e"], n)
    assert resolve(cut, store) == whole[:n] and pieces_length(cut) == n


# -- the same bytes as the inline encoders, from real buffers of msgpack records -------------------------------


def _buffers(records: list[bytes], sizes: list[int]) -> list[Buffer]:
    """`records` packed back to back and cut into buffers of `sizes` (the rest in one last buffer), with each
    buffer's first record offset and continued record as the producer sets them."""
    stream = b"".join(records)
    starts, pos = [], 0
    for r in records:
        starts.append(pos)
        pos += len(r)
    out, at = [], 0
    for size in [*sizes, len(stream)]:
        if at >= len(stream):
            break
        chunk = stream[at:at + max(1, size)]
        inside = [s for s in starts if at <= s < at + len(chunk)]
        first = inside[0] - at if inside else -1
        continued = None
        if at not in starts:
            i = max(k for k, s in enumerate(starts) if s < at)
            continued = records[i]
        out.append(Buffer(chunk, first, continued))
        at += len(chunk)
    return out


records_st = st.lists(st.binary(max_size=9).map(lambda b: bytes([0xC4, len(b)]) + b), min_size=1, max_size=8)


@given(records_st, st.lists(st.integers(1, 12), max_size=8), st.integers(0, 3), st.integers(0, 2))
@example([b"\xc4\x01\xc1"], [1], 1, 0)  # the kept buffer continues a record whose head the reader holds
def test_captures_give_the_inline_bytes(records: list[bytes], sizes: list[int], drop: int, prefix_n: int) -> None:
    every = _buffers(records, sizes)
    buffers = every[drop:]
    if not buffers:
        return
    # what a reader holds before the first kept buffer: whole records, or, when that buffer continues a record,
    # the head of that record (the reader's bytes always start at a record boundary)
    at, starts = sum(len(b.data) for b in every[:drop]), [sum(map(len, records[:i])) for i in range(len(records))]
    head = 0 if at in starts else max(s for s in starts if s < at)
    prefix = b"".join(records[:prefix_n]) if at in starts else b"".join(records)[head:at]
    cap, end = input_capture(prefix, buffers)
    t = SegmentTracker("v")
    t.begin(1, savepoint=False)
    c = t.capture(1, "in", {"e": cap})
    store = {c.segment: b"".join(c.new_parts)}
    assert end() == len(whole_records(prefix, buffers)) == whole_records_end(prefix, buffers)
    assert resolve(truncate(c.pieces["e"], end()), store) == whole_records(prefix, buffers)
    out = output_capture(buffers)
    assert out is not None
    t.begin(2, savepoint=False)
    c = t.capture(2, "out", {"e": out})
    store[c.segment] = b"".join(c.new_parts)
    assert resolve(c.pieces["e"], store) == overtaken_records(buffers)


# -- random histories -------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    pieces: dict[str, list[bytes | Ref]]
    expected: dict[str, bytes]
    savepoint: bool
    segments: set[str] = field(default_factory=set)


ops = st.lists(st.tuples(st.sampled_from(["push", "pop", "unaligned", "aligned", "savepoint", "complete",
                                          "notify", "abort"]), st.integers(0, 7)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 3))
def test_random_histories_restore_exactly_and_leave_no_orphans(history: list[tuple[str, int]], retain: int) -> None:
    tracker = SegmentTracker("v-0")
    queues: dict[str, list[tuple[int, bytes]]] = {"a": [], "b": []}
    store: dict[str, bytes] = {}
    pending: dict[int, Checkpoint] = {}
    completed: dict[int, Checkpoint] = {}  # retained, periodic
    savepoints: dict[int, Checkpoint] = {}
    notifications: list[tuple[str, int]] = []  # the coordinator's, reaching the task late
    next_id, next_buffer = 1, 0

    def discard(n: int) -> None:
        referenced = set().union(*(c.segments for c in completed.values()))
        for name in unneeded_segments(list(store), referenced, n, {*pending, *completed}):
            del store[name]
        for c in completed.values():  # nothing a retained checkpoint lists is ever deleted
            assert c.segments <= set(store)
        orphans = {s for s in store if s not in referenced and segment_writer(s) not in {*pending, *completed}
                   and (segment_writer(s) or 0) <= n}
        assert not orphans

    for op, arg in history:
        channel = "ab"[arg % 2]
        if op == "push":
            for _ in range(1 + arg // 2):
                queues[channel].append((next_buffer, bytes([next_buffer % 256]) * (1 + next_buffer % 3)))
                next_buffer += 1
        elif op == "pop":
            del queues[channel][:arg // 2 + 1]
        elif op in ("unaligned", "aligned", "savepoint"):
            n, next_id = next_id, next_id + 1
            tracker.begin(n, savepoint=op == "savepoint")
            pieces: dict[str, list[bytes | Ref]] = {}
            expected: dict[str, bytes] = {}
            if op != "aligned":
                skip = arg % 3
                caps = {k: ChannelCapture(bytes([arg]), list(q), skip) for k, q in queues.items()}
                cap = tracker.capture(n, "in", caps)
                if cap.segment is not None:
                    store[cap.segment] = b"".join(cap.new_parts)
                pieces = cap.pieces
                expected = {k: (bytes([arg]) + b"".join(d for _, d in q))[:1] + b"".join(d for _, d in q)[skip:]
                            for k, q in queues.items()}
            pending[n] = Checkpoint(pieces, expected, op == "savepoint", segments_of(pieces))
        elif op == "complete" and pending:
            n = sorted(pending)[arg % len(pending)]
            for older in [m for m in pending if m < n]:  # subsumed: aborted
                pending.pop(older)
                notifications.append(("abort", older))
                discard(older)
            cp = pending.pop(n)
            assert cp.segments <= set(store), "a completing checkpoint references a deleted segment"
            notifications.append(("complete", n))
            if cp.savepoint:
                assert not cp.segments
                savepoints[n] = cp
            else:
                completed[n] = cp
                for old in sorted(completed)[:-retain]:
                    del completed[old]
                    discard(old)
        elif op == "abort" and pending:
            n = sorted(pending)[arg % len(pending)]
            pending.pop(n)
            notifications.append(("abort", n))
            discard(n)
        elif op == "notify" and notifications:
            for kind, n in notifications[:arg + 1]:
                tracker.completed(n) if kind == "complete" else tracker.aborted(n)
            del notifications[:arg + 1]
        for cp in [*completed.values(), *savepoints.values()]:  # every retained checkpoint restores exactly
            for key, want in cp.expected.items():
                assert resolve(cp.pieces[key], store) == want
